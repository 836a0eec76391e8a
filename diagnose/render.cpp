#include "diagnose/render.h"

#include <sstream>

#include <cmath>
#include <cstdio>
#include <string>

#include "common/json.h"

namespace strata::diagnose {

namespace {

std::string json_string(const std::string& s) { return json_str(s); }

// JSON has no NaN: unknown numbers are null.
std::string json_number(double v, const char* f = "%.3f") {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string num(double v, const char* f = "%.1f") { return std::isfinite(v) ? json_number(v, f) : "?"; }

}  // namespace

void write_json(const Diagnosis& dx, std::ostream& out) {
  out << "{\"job\":" << json_string(dx.job) << ",\"ranks\":" << dx.ranks
      << ",\"step_ms\":" << json_number(dx.step_ms) << ",\"baseline_step_ms\":" << json_number(dx.baseline_step_ms)
      << ",\"healthy\":" << (healthy(dx) ? "true" : "false");
  if (!dx.note.empty()) out << ",\"note\":" << json_string(dx.note);
  if (dx.waiting_for_data) out << ",\"waiting_for_data\":true";
  out << ",\"data_notes\":[";
  for (size_t i = 0; i < dx.data_notes.size(); ++i) out << (i ? "," : "") << json_string(dx.data_notes[i]);
  out << "],\"unexplained\":[";
  for (size_t i = 0; i < dx.unexplained.size(); ++i) {
    const auto& u = dx.unexplained[i];
    out << (i ? "," : "") << "{\"rank\":" << u.rank << ",\"node\":" << json_string(u.node)
        << ",\"lost_ms_per_step\":" << json_number(u.lost_ms_per_step) << ",\"text\":" << json_string(u.text) << "}";
  }
  out << "],\"findings\":[";
  for (size_t i = 0; i < dx.findings.size(); ++i) {
    const auto& f = dx.findings[i];
    out << (i ? "," : "") << "{\"scope\":" << json_string(scope_name(f.scope)) << ",\"rank\":" << f.rank << ",\"node\":" << json_string(f.node)
        << ",\"layer\":" << json_string(f.layer) << ",\"cause\":" << json_string(cause_name(f.cause))
        << ",\"culprit\":" << json_string(f.culprit) << ",\"lost_ms_per_step\":" << json_number(f.lost_ms_per_step)
        << ",\"confidence\":" << json_number(f.confidence, "%.2f") << ",\"evidence\":[";
    for (size_t k = 0; k < f.evidence.size(); ++k) out << (k ? "," : "") << json_string(f.evidence[k]);
    out << "],\"advice\":" << json_string(f.advice) << "}";
  }
  out << "],\"second_opinion\":{\"outlier_ranks\":[";
  for (size_t i = 0; i < dx.second.outlier_ranks.size(); ++i) out << (i ? "," : "") << dx.second.outlier_ranks[i];
  out << "],\"notes\":[";
  for (size_t i = 0; i < dx.second.notes.size(); ++i) out << (i ? "," : "") << json_string(dx.second.notes[i]);
  const auto& ot = dx.second.over_time;
  out << "],\"disagrees\":" << (dx.second.disagrees ? "true" : "false")
      << ",\"summary\":" << json_string(dx.second.summary) << ",\"compared\":" << (dx.second.compared ? "true" : "false")
      << ",\"over_time\":{\"fitted\":" << (ot.fitted ? "true" : "false") << ",\"k\":" << ot.k << ",\"points\":" << ot.points
      << ",\"outlier_ranks\":[";
  for (size_t i = 0; i < ot.outlier_ranks.size(); ++i) out << (i ? "," : "") << ot.outlier_ranks[i];
  out << "],\"shares\":[";
  for (size_t i = 0; i < ot.shares.size(); ++i) out << (i ? "," : "") << json_number(ot.shares[i], "%.2f");
  out << "],\"job_wide\":" << (ot.job_wide ? "true" : "false") << ",\"notes\":[";
  for (size_t i = 0; i < ot.notes.size(); ++i) out << (i ? "," : "") << json_string(ot.notes[i]);
  out << "],\"summary\":" << json_string(ot.summary) << "}}}\n";
}

std::string text_of(const Diagnosis& dx) {
  std::ostringstream o;
  write_text(dx, o);
  return o.str();
}

void write_text(const Diagnosis& dx, std::ostream& out) {
  out << "job " << (dx.job.empty() ? "(unnamed)" : dx.job) << ": " << dx.ranks << " ranks, step " << num(dx.step_ms)
      << " ms";
  if (std::isfinite(dx.baseline_step_ms)) out << " (baseline " << num(dx.baseline_step_ms) << " ms)";
  out << "\n";
  if (!dx.note.empty()) {
    out << dx.note << "\n";
  } else if (healthy(dx)) {
    out << "healthy: no rank, layer or link explains a slowdown\n";
  }
  for (const auto& n : dx.data_notes) out << "data: " << n << "\n";
  for (const auto& u : dx.unexplained) {
    out << "straggler, cause unknown: rank " << u.rank << (u.node.empty() ? "" : " (node " + u.node + ")") << ", "
        << num(u.lost_ms_per_step) << " ms per step\n   " << u.text << "\n";
  }
  for (size_t i = 0; i < dx.findings.size(); ++i) {
    const auto& f = dx.findings[i];
    out << "\n" << (i + 1) << ". " << cause_name(f.cause);
    if (f.scope == Scope::kJob) out << " on the whole job";
    else out << " on rank " << f.rank;
    if (!f.node.empty()) out << " (node " << f.node << ")";
    out << ", " << f.layer << " layer: " << f.culprit << "\n";
    out << "   costs " << num(f.lost_ms_per_step) << " ms per step, confidence " << num(100 * f.confidence, "%.0f") << "%\n";
    out << "   evidence:\n";
    for (const auto& e : f.evidence) out << "     - " << e << "\n";
    if (!f.advice.empty()) out << "   what to do: " << f.advice << "\n";
  }
  out << "\nsecond opinion (robust z-scores over per-rank metrics and per-function times): " << dx.second.summary << "\n";
  for (const auto& n : dx.second.notes) out << "  " << n << "\n";
  const auto& ot = dx.second.over_time;
  out << "over time (a Gaussian mixture over every rank's per-step metrics, baseline and window): " << ot.summary << "\n";
  for (const auto& n : ot.notes) out << "  " << n << "\n";
}

}  // namespace strata::diagnose
