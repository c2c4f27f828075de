// The metrics of reward_diagnostics.h from per-pair scores: sums (reducible over ranks), then
// ratios; the JSON and the human table.
#include "rlhf/rewards/reward_score_summary.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
// A named namespace, not an anonymous one: the unity build compiles this file in one unit with
// other rlhf files, whose anonymous helpers (ratio, fixed, ...) would otherwise collide.
namespace rm_summary {

constexpr int kBins = 10;
constexpr double kBinWidth = 0.5 / kBins;  // confidence max(p, 1 - p) lies in [0.5, 1]
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The length buckets: upper edges at the lower quartile, the median, the upper quartile and the
// maximum of the chosen lengths (numpy's "lower" quantile: a value that occurs), duplicates
// merged, so every bucket (previous edge, edge] holds at least the pairs at its edge.
struct Buckets {
  std::vector<int64_t> upper;  // [K] ascending
  int64_t min = 0;             // the shortest chosen answer: the first bucket's lower bound

  explicit Buckets(std::vector<int64_t> lengths) {
    if (lengths.empty()) return;
    std::sort(lengths.begin(), lengths.end());
    const size_t n = lengths.size();
    for (double q : {0.25, 0.5, 0.75}) upper.push_back(lengths[static_cast<size_t>(q * static_cast<double>(n - 1))]);
    upper.push_back(lengths.back());
    upper.erase(std::unique(upper.begin(), upper.end()), upper.end());
    min = lengths.front();
  }
  size_t index_of(int64_t tokens) const {
    return std::min<size_t>(std::lower_bound(upper.begin(), upper.end(), tokens) - upper.begin(), upper.size() - 1);
  }
};

// Every metric's numerator and denominator, summed over pairs.
struct Sums {
  double pairs = 0, correct = 0, margin = 0, chosen = 0, rejected = 0;
  double answers = 0, x = 0, y = 0, xx = 0, yy = 0, xy = 0, clipped = 0;  // x: answer tokens, y: score
  std::array<double, kBins> bin_pairs{}, bin_confidence{}, bin_correct{};
  std::vector<double> bucket_pairs, bucket_correct;  // [K]
  std::array<double, 3> padded{}, truncated{};       // probed pairs, wins, sum of score changes

  explicit Sums(size_t buckets) : bucket_pairs(buckets), bucket_correct(buckets) {}

  std::vector<double*> fields() {
    std::vector<double*> f = {&pairs, &correct, &margin, &chosen, &rejected, &answers, &x, &y, &xx, &yy, &xy, &clipped};
    for (auto* a : {&bin_pairs, &bin_confidence, &bin_correct}) {
      for (double& v : *a) f.push_back(&v);
    }
    for (auto* a : {&padded, &truncated}) {
      for (double& v : *a) f.push_back(&v);
    }
    for (auto* v : {&bucket_pairs, &bucket_correct}) {
      for (double& e : *v) f.push_back(&e);
    }
    return f;
  }

  void add_answer(double score, int64_t tokens, double clip) {
    const double t = static_cast<double>(tokens);
    answers += 1;
    x += t;
    y += score;
    xx += t * t;
    yy += score * score;
    xy += t * score;
    clipped += std::abs(score) > clip ? 1 : 0;
  }

  void add_probe(std::array<double, 3>& probe, double probed, double original) {
    if (std::isnan(probed)) return;
    probe[0] += 1;
    probe[1] += probed > original ? 1 : 0;
    probe[2] += probed - original;
  }
};

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

RewardProbe probe_of(const std::array<double, 3>& s) {
  return {static_cast<int64_t>(s[0]), ratio(s[1], s[0]), ratio(s[2], s[0])};
}

// Pearson r from raw moments; 0 when a variance vanishes (constant lengths or scores: no
// measurable bias). Relative thresholds, as E[x^2] - E[x]^2 of a constant rounds to ~1e-16 E[x]^2.
double pearson(const Sums& s) {
  if (s.answers < 2) return 0.0;
  const double n = s.answers, mx = s.x / n, my = s.y / n;
  const double vx = s.xx / n - mx * mx, vy = s.yy / n - my * my, cov = s.xy / n - mx * my;
  if (vx <= 1e-12 * std::max(1.0, mx * mx) || vy <= 1e-12 * std::max(1.0, my * my)) return 0.0;
  return std::clamp(cov / std::sqrt(vx * vy), -1.0, 1.0);
}

std::string fixed(double v, int digits = 3) {
  if (std::isnan(v)) return "-";
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", digits, v);
  return text;
}

std::string percent(double share) { return fixed(100.0 * share, 1) + "%"; }

nlohmann::json probe_json(const RewardProbe& p) {
  return {{"pairs", p.pairs}, {"win_rate", p.win_rate}, {"mean_score_change", p.mean_score_change}};
}

RewardDiagnostics summarize(const RewardPairScores& local, const std::vector<int64_t>& all_chosen_tokens,
                            double clip_reward_value, const std::function<void(std::vector<double>&)>& reduce) {
  const size_t n = local.chosen.size();
  DSCHAT_CHECK(local.rejected.size() == n && local.chosen_tokens.size() == n && local.rejected_tokens.size() == n &&
                   (local.padded.empty() || local.padded.size() == n) &&
                   (local.truncated.empty() || local.truncated.size() == n),
               InvalidArgument, "summarize_reward_scores: every per-pair vector needs ", n,
               " entries (the chosen scores'); padded/truncated may be empty");
  const Buckets buckets(all_chosen_tokens);
  DSCHAT_CHECK(n == 0 || !buckets.upper.empty(), InvalidArgument,
               "summarize_reward_scores: all_chosen_tokens is empty but there are pairs");
  Sums s(buckets.upper.size());
  for (size_t i = 0; i < n; ++i) {
    const double c = local.chosen[i], r = local.rejected[i], d = c - r;
    const bool correct = d > 0;  // a tie is not a win, as in step 2's accuracy
    s.pairs += 1;
    s.correct += correct;
    s.margin += d;
    s.chosen += c;
    s.rejected += r;
    s.add_answer(c, local.chosen_tokens[i], clip_reward_value);
    s.add_answer(r, local.rejected_tokens[i], clip_reward_value);
    // The Bradley-Terry probability that chosen wins, folded: max(p, 1 - p) = sigmoid(|d|) is the
    // confidence in the model's own pick, and the pick is right when d > 0.
    const double confidence = 1.0 / (1.0 + std::exp(-std::abs(d)));
    const int bin = std::clamp(static_cast<int>(std::floor((confidence - 0.5) / kBinWidth)), 0, kBins - 1);
    s.bin_pairs[bin] += 1;
    s.bin_confidence[bin] += confidence;
    s.bin_correct[bin] += correct;
    const size_t b = buckets.index_of(local.chosen_tokens[i]);
    s.bucket_pairs[b] += 1;
    s.bucket_correct[b] += correct;
    if (!local.padded.empty()) s.add_probe(s.padded, local.padded[i], c);
    if (!local.truncated.empty()) s.add_probe(s.truncated, local.truncated[i], c);
  }
  std::vector<double*> fields = s.fields();
  std::vector<double> flat;
  for (double* f : fields) flat.push_back(*f);
  reduce(flat);
  for (size_t i = 0; i < fields.size(); ++i) *fields[i] = flat[i];

  RewardDiagnostics out;
  out.pairs = static_cast<int64_t>(s.pairs);
  out.accuracy = ratio(s.correct, s.pairs);
  out.mean_margin = ratio(s.margin, s.pairs);
  out.chosen_score = ratio(s.chosen, s.pairs);
  out.rejected_score = ratio(s.rejected, s.pairs);
  out.score_mean = ratio(s.y, s.answers);
  out.score_std = std::sqrt(std::max(0.0, ratio(s.yy, s.answers) - out.score_mean * out.score_mean));
  out.clip_reward_value = clip_reward_value;
  out.clip_share = ratio(s.clipped, s.answers);
  out.length_bias = pearson(s);
  for (size_t b = 0; b < buckets.upper.size(); ++b) {
    const int64_t lo = b == 0 ? buckets.min : buckets.upper[b - 1] + 1;
    out.length_buckets.push_back(
        {lo, buckets.upper[b], static_cast<int64_t>(s.bucket_pairs[b]), ratio(s.bucket_correct[b], s.bucket_pairs[b])});
  }
  for (int b = 0; b < kBins; ++b) {
    const double count = s.bin_pairs[b];
    out.calibration.push_back({0.5 + b * kBinWidth, 0.5 + (b + 1) * kBinWidth, static_cast<int64_t>(count),
                               count > 0 ? s.bin_confidence[b] / count : kNaN,
                               count > 0 ? s.bin_correct[b] / count : kNaN});
    out.ece += ratio(std::abs(s.bin_correct[b] - s.bin_confidence[b]), s.pairs);
  }
  out.padding = probe_of(s.padded);
  out.truncation = probe_of(s.truncated);
  return out;
}

}  // namespace rm_summary

RewardDiagnostics summarize_reward_scores(const RewardPairScores& local, const std::vector<int64_t>& all_chosen_tokens,
                                          double clip_reward_value,
                                          const std::function<void(std::vector<double>&)>& reduce) {
  return rm_summary::summarize(local, all_chosen_tokens, clip_reward_value, reduce);
}

RewardDiagnostics summarize_reward_scores(const RewardPairScores& scores, const RewardDiagnosticsOptions& options) {
  return summarize_reward_scores(scores, scores.chosen_tokens, options.clip_reward_value, [](std::vector<double>&) {});
}

nlohmann::json RewardDiagnostics::to_json() const {
  using rm_summary::probe_json;
  nlohmann::json buckets = nlohmann::json::array(), bins = nlohmann::json::array();
  for (const RewardLengthBucket& b : length_buckets) {
    buckets.push_back({{"min_tokens", b.min_tokens}, {"max_tokens", b.max_tokens}, {"pairs", b.pairs},
                       {"accuracy", b.accuracy}});
  }
  for (const RewardCalibrationBin& b : calibration) {
    // An empty bin has no mean: null, not NaN (which JSON cannot hold).
    auto value = [&](double v) { return b.pairs > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    bins.push_back({{"lower", b.lower}, {"upper", b.upper}, {"pairs", b.pairs},
                    {"mean_confidence", value(b.mean_confidence)}, {"accuracy", value(b.accuracy)}});
  }
  return {{"pairs", pairs},
          {"accuracy", accuracy},
          {"mean_margin", mean_margin},
          {"chosen_score", chosen_score},
          {"rejected_score", rejected_score},
          {"length_bias", length_bias},
          {"length_buckets", buckets},
          {"calibration", bins},
          {"ece", ece},
          {"score_mean", score_mean},
          {"score_std", score_std},
          {"clip_reward_value", clip_reward_value},
          {"clip_share", clip_share},
          {"padding_probe", probe_json(padding)},
          {"truncation_probe", probe_json(truncation)}};
}

std::string format_reward_diagnostics(const RewardDiagnostics& d) {
  using rm_summary::fixed;
  using rm_summary::percent;
  std::ostringstream out;
  char line[160];
  out << "reward-model diagnostics over " << d.pairs << " pairs\n";
  out << "  accuracy " << fixed(d.accuracy) << "   mean margin (s_chosen - s_rejected) " << fixed(d.mean_margin)
      << "   mean chosen " << fixed(d.chosen_score) << "   mean rejected " << fixed(d.rejected_score) << "\n";
  out << "  scores: mean " << fixed(d.score_mean) << ", std " << fixed(d.score_std) << ", "
      << percent(d.clip_share) << " beyond clip_reward_value " << fixed(d.clip_reward_value, 2) << "\n";
  out << "  length bias (Pearson r, score vs answer tokens, all answers) " << fixed(d.length_bias)
      << (d.length_bias > 0 ? "  (longer answers score higher)" : "") << "\n";
  out << "accuracy by chosen-answer length (quartiles)\n    tokens      pairs  accuracy\n";
  for (const RewardLengthBucket& b : d.length_buckets) {
    const std::string range = std::to_string(b.min_tokens) + "-" + std::to_string(b.max_tokens);
    std::snprintf(line, sizeof(line), "    %-10s %6lld  %s\n", range.c_str(), static_cast<long long>(b.pairs),
                  fixed(b.accuracy).c_str());
    out << line;
  }
  out << "calibration (confidence max(p, 1-p), p = sigmoid(s_chosen - s_rejected))\n"
         "    confidence   pairs  mean conf  accuracy\n";
  for (const RewardCalibrationBin& b : d.calibration) {
    std::snprintf(line, sizeof(line), "    %.2f-%.2f  %6lld  %9s  %8s\n", b.lower, b.upper,
                  static_cast<long long>(b.pairs), fixed(b.mean_confidence).c_str(), fixed(b.accuracy).c_str());
    out << line;
  }
  out << "  ECE " << fixed(d.ece) << "\n";
  out << "probes of the chosen answer   pairs  scores higher  mean score change\n";
  for (const auto& [name, p] : {std::pair<const char*, RewardProbe>{"padded with filler", d.padding},
                                {"truncated to half", d.truncation}}) {
    std::snprintf(line, sizeof(line), "    %-24s %6lld  %13s  %17s\n", name, static_cast<long long>(p.pairs),
                  percent(p.win_rate).c_str(), fixed(p.mean_score_change).c_str());
    out << line;
  }
  return out.str();
}

}  // namespace rlhf
}  // namespace dschat
