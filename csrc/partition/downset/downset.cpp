#include "partition/downset/downset.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>

#include "partition/downset/layer_groups.h"
#include "partition/recompute.h"

namespace graphpipe::partition {

namespace {

using downset::bit;
using downset::components;
using downset::enumerate_downsets;
using downset::Figures;
using downset::figures_of;
using downset::group_parts;
using downset::Grouping;
using downset::kInf;
using downset::lowest;
using downset::Set;

// One layer J \ I of a chain of down-sets: its components are parts[first .. first + count).
struct Layer {
  int from = 0, to = 0;  // indices of I and J
  int first = 0, count = 0;
  bool roomy = false;  // fits on one device at the most micro-batches any stage holds
};

// The DP of downset.h over one problem: best[r][c][I] for r layers, at most c stages, down-set I.
class DownsetSearch {
 public:
  explicit DownsetSearch(const Problem& p) : p_(p), n_(static_cast<int>(p.num_nodes())) {}

  std::vector<std::vector<int>> run(int max_downsets) {
    if (n_ == 0 || n_ > 64 || !enumerate(max_downsets) || !build_layers()) return {};
    solve();
    return rebuild();
  }

 private:
  int in_flight(int r) const { return static_cast<int>(std::min<std::int64_t>(r, p_.num_micro_batches)); }
  std::size_t at(int r, int c, int i) const { return (static_cast<std::size_t>(r) * (K_ + 1) + c) * d_ + i; }
  std::size_t step_at(int r, int c) const { return static_cast<std::size_t>(r) * (K_ + 1) + c; }

  bool enumerate(int max_downsets);
  bool build_layers();
  std::vector<Grouping> groupings(const Layer& layer, int r);
  const double* slowest_of(std::size_t l, int r);
  std::vector<double> first_layer_tails(const Layer& layer, int r, int most);
  void solve();
  void relax(std::size_t l, int r);
  std::vector<std::vector<int>> rebuild();
  std::vector<int> rebuild_depth(int r);

  const Problem& p_;
  const int n_;
  int K_ = 1;    // the most stages
  int d_ = 0;    // down-sets
  int all_ = 0;  // the whole graph: the only down-set of the largest size
  std::vector<Set> sets_, neighbours_;
  // Components recur in many layers: their figures are computed once.
  std::unordered_map<Set, int> component_index_;
  std::vector<Set> component_set_;
  std::vector<Figures> component_figures_;
  std::vector<int> parts_;  // component indices, layer after layer
  std::vector<Layer> layers_;
  std::vector<Figures> scratch_;
  // The least slowest stage of each stage count of a layer at r layers before the end; a roomy
  // layer's are the same at every r and kept (NaN: not computed yet).
  std::vector<double> roomy_slowest_, slowest_;
  // best[r][c][i], flattened (at()); via: the layer and stages_of: its stage count.
  std::vector<double> best_;
  std::vector<int> via_, stages_of_;
  // The predicted step of plans that start at the empty down-set, by (r, c) (step_at()).
  std::vector<double> step_;
};

bool DownsetSearch::enumerate(int max_downsets) {
  std::vector<Set> preds(n_, 0);
  neighbours_.assign(n_, 0);
  for (const graph::Edge& e : p_.graph->edges()) {
    preds[e.dst] |= bit(e.src);
    neighbours_[e.dst] |= bit(e.src);
    neighbours_[e.src] |= bit(e.dst);
  }
  sets_ = enumerate_downsets(preds, max_downsets);
  if (sets_.empty()) return false;
  d_ = static_cast<int>(sets_.size());
  all_ = d_ - 1;
  K_ = std::max(1, std::min(p_.max_stages, n_));
  return static_cast<double>(K_ + 1) * (K_ + 1) * d_ <= kMaxWork / 10;
}

// Every layer J \ I of two nested down-sets with its components; a layer with a component whose
// weights alone overflow fits in no stage and is left out. False when they are too many.
bool DownsetSearch::build_layers() {
  // Whether the layer fits on one device at r layers before the end without recomputation:
  // then so does every stage of its components at every r' <= r, and none is recomputed, so its
  // groupings are the same at every such r.
  auto fits_plain = [&](const Figures& f, int r) {
    const StageMemory m = f.memory(in_flight(r), p_.memory_limit);
    return !m.recompute && m.bytes <= p_.memory_limit;
  };
  for (int i = 0; i < d_; ++i) {
    for (int j = i + 1; j < d_; ++j) {
      if (sets_[i] & ~sets_[j]) continue;
      Layer layer{i, j, static_cast<int>(parts_.size()), 0, false};
      Figures whole;
      bool heavy = false;
      for (Set component : components(sets_[j] & ~sets_[i], neighbours_)) {
        auto [it, added] = component_index_.emplace(component, static_cast<int>(component_set_.size()));
        if (added) {
          component_set_.push_back(component);
          component_figures_.push_back(figures_of(p_, component));
        }
        const Figures& f = component_figures_[it->second];
        heavy = heavy || f.static_bytes > p_.memory_limit;
        whole.add(f);
        parts_.push_back(it->second);
        ++layer.count;
      }
      if (heavy) {
        parts_.resize(layer.first);
        continue;
      }
      layer.roomy = fits_plain(whole, K_);
      layers_.push_back(layer);
    }
  }
  return static_cast<double>(layers_.size()) * K_ * K_ <= kMaxWork;
}

std::vector<Grouping> DownsetSearch::groupings(const Layer& layer, int r) {
  scratch_.clear();
  for (int q = 0; q < layer.count; ++q) scratch_.push_back(component_figures_[parts_[layer.first + q]]);
  return layer.roomy ? group_parts(scratch_.data(), layer.count, K_, in_flight(K_), p_.memory_limit)
                     : group_parts(scratch_.data(), layer.count, K_ - (r - 1), in_flight(r), p_.memory_limit);
}

const double* DownsetSearch::slowest_of(std::size_t l, int r) {
  const Layer& layer = layers_[l];
  if (layer.count == 1) {  // most layers: one component, one stage
    slowest_.assign(K_ + 1, kInf);
    const Figures& f = component_figures_[parts_[layer.first]];
    slowest_[1] = f.time_if_fits(in_flight(r), p_.memory_limit);
    return slowest_.data();
  }
  double* kept = roomy_slowest_.data() + l * (K_ + 1);
  if (layer.roomy && !std::isnan(kept[0])) return kept;
  std::vector<Grouping> g = groupings(layer, r);
  double* out = layer.roomy ? kept : slowest_.data();
  for (int s = 0; s <= K_; ++s) out[s] = s < static_cast<int>(g.size()) ? g[s].slowest : kInf;
  return out;
}

// For s = 1..most, the largest optimizer step among the layer's stages grouped into s.
std::vector<double> DownsetSearch::first_layer_tails(const Layer& layer, int r, int most) {
  std::vector<double> tails(most + 1, 0.0);
  const std::vector<Grouping> all_groupings = groupings(layer, r);
  for (int s = 1; s <= most && s < static_cast<int>(all_groupings.size()); ++s) {
    if (all_groupings[s].group.empty()) continue;  // no grouping into s stages fits
    std::vector<double> optimizer(s, 0.0);
    for (int q = 0; q < layer.count; ++q) {
      optimizer[all_groupings[s].group[q]] += component_figures_[parts_[layer.first + q]].optimizer;
    }
    tails[s] = *std::max_element(optimizer.begin(), optimizer.end());
  }
  return tails;
}

void DownsetSearch::solve() {
  roomy_slowest_.assign(layers_.size() * static_cast<std::size_t>(K_ + 1), std::numeric_limits<double>::quiet_NaN());
  slowest_.assign(K_ + 1, kInf);
  best_.assign(static_cast<std::size_t>(K_ + 1) * (K_ + 1) * d_, kInf);
  via_.assign(best_.size(), -1);
  stages_of_.assign(best_.size(), 0);
  step_.assign(static_cast<std::size_t>(K_ + 1) * (K_ + 1), kInf);
  for (int c = 0; c <= K_; ++c) best_[at(0, c, all_)] = 0.0;
  std::vector<char> reached(d_);  // down-sets from which r - 1 layers can finish
  for (int r = 1; r <= K_; ++r) {
    for (int i = 0; i < d_; ++i) {
      reached[i] = 0;
      for (int c = 0; c <= K_ && !reached[i]; ++c) reached[i] = best_[at(r - 1, c, i)] < kInf;
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      if (reached[layer.to] && (r == 1) == (layer.to == all_)) relax(l, r);
    }
  }
}

// best[r][c][I] from layer l = J \ I and best[r - 1][c - s][J], for each stage count s of the
// layer. The first layer's stages have no stage upstream, so their optimizer steps run past the
// pipeline's end (evaluate.h's optimizer tail): plans that start at the empty down-set are ranked
// by their predicted step, (M + r - 1) x slowest stage + that tail, not by the slowest stage
// alone: a slightly slower stage elsewhere may shorten the first layer's optimizer step.
void DownsetSearch::relax(std::size_t l, int r) {
  const Layer& layer = layers_[l];
  const double* least = slowest_of(l, r);
  const int most = std::min(layer.count, K_ - (r - 1));
  const std::vector<double> tails = layer.from == 0 ? first_layer_tails(layer, r, most) : std::vector<double>{};
  for (int s = 1; s <= most; ++s) {
    if (least[s] == kInf) continue;
    const double layer_slowest = least[s];
    for (int c = s + r - 1; c <= K_; ++c) {
      const double rest = best_[at(r - 1, c - s, layer.to)];
      if (rest == kInf) continue;
      const double value = std::max(layer_slowest, rest);
      const std::size_t here = at(r, c, layer.from);
      if (layer.from == 0) {
        double& predicted = step_[step_at(r, c)];
        const double candidate = static_cast<double>(p_.num_micro_batches + r - 1) * value + tails[s];
        if (!(candidate < predicted)) continue;
        predicted = candidate;
      } else if (!(value < best_[here])) {
        continue;
      }
      best_[here] = value;
      via_[here] = static_cast<int>(l);
      stages_of_[here] = s;
    }
  }
}

std::vector<std::vector<int>> DownsetSearch::rebuild() {
  std::vector<std::vector<int>> plans;
  for (int r = 1; r <= K_; ++r) {
    if (step_[step_at(r, K_)] == kInf) continue;
    std::vector<int> assignment = rebuild_depth(r);
    if (std::find(plans.begin(), plans.end(), assignment) == plans.end()) plans.push_back(std::move(assignment));
  }
  return plans;
}

// The plan of depth bound r on all K stages, layer by layer from the empty down-set.
std::vector<int> DownsetSearch::rebuild_depth(int r) {
  std::vector<int> assignment(n_, -1);
  int i = 0, c = K_, base = 0;
  for (int left = r; left >= 1; --left) {
    const std::size_t here = at(left, c, i);
    const Layer& layer = layers_[via_[here]];
    const int s = stages_of_[here];
    const Grouping grouping = groupings(layer, left)[s];
    for (int q = 0; q < layer.count; ++q) {
      for (Set part = component_set_[parts_[layer.first + q]]; part; part &= part - 1) {
        assignment[lowest(part)] = base + grouping.group[q];
      }
    }
    base += s;
    c -= s;
    i = layer.to;
  }
  return assignment;
}

}  // namespace

std::vector<std::vector<int>> downset_plans(const Problem& p, int max_downsets) {
  return DownsetSearch(p).run(max_downsets);
}

}  // namespace graphpipe::partition
