// The diagnosis as people read it, and as DESIGN §8's `diagnose --json` contract fixes it:
//   {"job":..,"findings":[{"scope":"rank|job","rank":..,"node":..,"layer":..,"cause":..,"culprit":..,
//     "lost_ms_per_step":..,"confidence":..,"evidence":[...]}]}
// plus keys the contract allows to be added: step times, advice, the second opinion.
#pragma once

#include <ostream>
#include <string>

#include "diagnose/engine.h"

namespace strata::diagnose {

void write_text(const Diagnosis& dx, std::ostream& out);
// write_text into a string (tests, logs).
std::string text_of(const Diagnosis& dx);
void write_json(const Diagnosis& dx, std::ostream& out);

}  // namespace strata::diagnose
