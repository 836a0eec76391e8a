// The profile model moved to common/profile.h (the store fills it, the exporters read it); its names
// stay reachable as report::Profile etc. for the exporters and their callers.
#pragma once

#include "common/profile.h"

namespace strata::report {

using strata::ProcessLabels;
using strata::Profile;
using strata::ProfileSample;

}  // namespace strata::report
