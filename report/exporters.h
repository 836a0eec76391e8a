// Profile exporters: folded (flamegraph.pl), pprof (gzipped profile.proto) and a text table.
#pragma once

#include <ostream>
#include <string>

#include "common/result.h"
#include "report/profile.h"

namespace strata::report {

// One line per distinct stack, root first: "frame;frame;...;leaf COUNT". Frames use
// Frame::display_name(); ';' inside names is replaced so the format stays parseable. Lines of
// identical stacks are merged. With `by_thread`, the process and thread ("comm-pid/tid") are the root
// frame.
void write_folded(const Profile& p, std::ostream& out, bool by_thread = false);

// gzipped perftools.profiles.Profile (proto/profile.proto): functions, locations (address = file
// offset), mappings (with build ids and file names), samples with pid/tid labels. Its sample total
// equals the folded total.
Status write_pprof(const Profile& p, const std::string& path);

// Top functions by self and total samples, with percentages; at most `limit` rows.
void write_top(const Profile& p, std::ostream& out, size_t limit = 25);

}  // namespace strata::report
