/* The testbed's device timeline is strata's GPU timeline format (abi/gpu_timeline.h): the
 * libcudart.so.13 stand-in writes what CUPTI activity records give on a real GPU, in the same file
 * layout strata's CUPTI injection library writes, so the agent reads both the same way. */
#ifndef STRATA_TESTBED_TIMELINE_H
#define STRATA_TESTBED_TIMELINE_H

#include "abi/gpu_timeline.h"

#endif /* STRATA_TESTBED_TIMELINE_H */
