// Profile exporters: folded (flamegraph.pl), pprof (gzipped profile.proto) and a text table.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>

#include "common/result.h"
#include "report/profile.h"

namespace strata::report {

// The name of a frame in folded output, so flame graphs tell the layers apart:
//   native, cuda: Frame::display_name()            "do_work", "libfoo.so+0x1a2b"
//   kernel:       display_name() + "_[k]"          "vfs_read_[k]" (flamegraph.pl colours these)
//   python:       display_name() + " (file:line)"  "train_step (train.py:42)"; " (file)" when the
//                 line is unknown, nothing when the file is
// ';' becomes ':' and line breaks become ' ', so a name can never split a line or a stack.
std::string folded_frame_name(const Frame& f);

// One line per distinct stack, root first: "frame;frame;...;leaf COUNT", names as
// folded_frame_name(). Lines of identical stacks are merged and sorted, so the output is stable.
// COUNT is in samples at the profile's period (Profile::weighted): a sample taken at a lower rate
// counts for more (99/24 at 24 Hz in a 99 Hz profile). COUNT is always a whole number (speedscope
// skips other lines): fractions are rounded by largest remainder, so the lines sum to the rounded
// total and no line with samples reads 0.
// Samples with an empty stack appear as "[no stack]" so that no sample is lost from the total;
// samples with count 0 are left out. With `by_thread`, the process and thread ("comm-pid/tid") are
// the root frame.
void write_folded(const Profile& p, std::ostream& out, bool by_thread = false);

// gzipped perftools.profiles.Profile (proto/profile.proto): functions, locations (address = file
// offset), mappings (with build ids and file names), samples with pid/tid labels. Its sample total
// equals the folded total.
//   - values per sample: {samples, count} and {cpu, nanoseconds} (the default: count times the
//     period of the windows the samples came from, so windows at a lowered rate weigh right) when
//     period_ns is set; {<kind>, <value_unit>} alone for other units (offcpu: {offcpu,
//     microseconds}); period_type {cpu, nanoseconds} with the profile's (configured) period, and a
//     num label "sample_period" (nanoseconds) on samples taken at another period
//   - one Mapping per (module, build id); frames without a module have mapping_id 0
//   - one Location per distinct frame, leaf first in each Sample, each with one Line; a sample
//     without a stack has no locations (pprof counts it in totals only)
//   - one Function per distinct (name, file); unresolved frames get a Function named by
//     display_name() ("libfoo.so+0x1a2b") so pprof shows what the folded output shows
//   - labels: "pid" and "tid" (num), "thread" (str, when the name is known)
Status write_pprof(const Profile& p, const std::string& path);

// Top functions by self (leaf) and by total (inclusive) samples, with percentages of the profile's
// total: two tables of at most `limit` rows, after a header line with the total. A function that
// appears several times in one stack (recursion) counts once toward its total for that stack.
// Functions are told apart by kind, module and name, so same-named code in two libraries gets
// two rows.
void write_top(const Profile& p, std::ostream& out, size_t limit = 25);

}  // namespace strata::report
