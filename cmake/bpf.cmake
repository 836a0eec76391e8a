# BPF programs: compiled with clang against the running kernel's BTF (CO-RE) and embedded
# through `bpftool gen skeleton`. Adding a program is one line: strata_bpf_program(NAME).
find_program(BPFTOOL bpftool PATHS /usr/sbin /usr/local/sbin REQUIRED)
find_program(BPF_CLANG clang REQUIRED)

set(STRATA_BPF_GEN ${CMAKE_BINARY_DIR}/generated/bpf)
file(MAKE_DIRECTORY ${STRATA_BPF_GEN})

set(STRATA_VMLINUX_BTF /sys/kernel/btf/vmlinux CACHE FILEPATH "kernel BTF used to generate vmlinux.h")
# vmlinux.h from the running kernel's BTF, made at configure time (CO-RE relocates against the
# target kernel's BTF at load time, so one build runs on other kernels too).
if(NOT EXISTS ${STRATA_BPF_GEN}/vmlinux.h)
  if(NOT EXISTS ${STRATA_VMLINUX_BTF})
    message(FATAL_ERROR "${STRATA_VMLINUX_BTF} not found: strata needs a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)")
  endif()
  execute_process(COMMAND ${BPFTOOL} btf dump file ${STRATA_VMLINUX_BTF} format c
                  OUTPUT_FILE ${STRATA_BPF_GEN}/vmlinux.h RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    file(REMOVE ${STRATA_BPF_GEN}/vmlinux.h)
    message(FATAL_ERROR "bpftool could not dump ${STRATA_VMLINUX_BTF}")
  endif()
endif()

set(STRATA_BPF_SKELETONS "" CACHE INTERNAL "")

# strata_bpf_program(oncpu) builds bpf/oncpu.bpf.c into generated/bpf/oncpu.skel.h.
function(strata_bpf_program name)
  set(src ${PROJECT_SOURCE_DIR}/bpf/${name}.bpf.c)
  set(obj ${STRATA_BPF_GEN}/${name}.bpf.o)
  set(skel ${STRATA_BPF_GEN}/${name}.skel.h)
  file(GLOB bpf_headers ${PROJECT_SOURCE_DIR}/bpf/*.bpf.h ${PROJECT_SOURCE_DIR}/abi/*.h)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -g -O2 -target bpf -D__TARGET_ARCH_x86 -Wall -Werror
            -I${STRATA_BPF_GEN} -I${PROJECT_SOURCE_DIR} -c ${src} -o ${obj}
    DEPENDS ${src} ${bpf_headers} ${STRATA_BPF_GEN}/vmlinux.h
    COMMENT "BPF ${name}.bpf.c"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${BPFTOOL} gen skeleton ${obj} name ${name}_bpf > ${skel}
    DEPENDS ${obj}
    COMMENT "BPF skeleton ${name}.skel.h"
    VERBATIM)
  set(STRATA_BPF_SKELETONS ${STRATA_BPF_SKELETONS} ${skel} CACHE INTERNAL "")
endfunction()
