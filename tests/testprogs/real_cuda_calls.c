/* Traced program: calls the REAL NCCL 2.28 and CUDA 13 runtime of the machine image (no GPU needed:
 * ncclGetVersion works anywhere, cudaGetDeviceCount reports the missing driver), after a start-up
 * pause like a real framework's, then prints what they returned. */
#include <stdio.h>
#include <unistd.h>

int ncclGetVersion(int* version);
int cudaGetDeviceCount(int* count);

int main(void) {
  usleep(300 * 1000);
  int version = 0, count = -1;
  int rn = ncclGetVersion(&version);
  int rc = cudaGetDeviceCount(&count);
  printf("ncclGetVersion -> %d (version %d), cudaGetDeviceCount -> %d (count %d)\n", rn, version, rc, count);
  return rn == 0 ? 0 : 1;
}
