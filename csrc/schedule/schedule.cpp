#include "schedule/schedule.h"

#include <algorithm>
#include <sstream>

namespace graphpipe::schedule {

namespace {

std::string where(int rank, std::size_t step, const Instruction& i) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step) + " (" + to_token(i) +
         ")";
}

// Positions of every instruction kind, indexed [stage or edge][micro-batch]; -1 when absent.
// All positions of one stage are on one rank, so comparing them compares program order.
struct Positions {
  int m = 0;
  std::vector<long> forward, backward, backward_input, backward_weight;  // [stage * m + mb]
  std::vector<long> send_act, recv_act, send_grad, recv_grad;  // [edge * m + mb]
  std::vector<long> optimizer, all_reduce;                  // [stage]

  Positions(int stages, int edges, int micro_batches) : m(micro_batches) {
    const std::size_t s = static_cast<std::size_t>(stages) * m;
    const std::size_t e = static_cast<std::size_t>(edges) * m;
    forward.assign(s, -1);
    backward.assign(s, -1);
    backward_input.assign(s, -1);
    backward_weight.assign(s, -1);
    send_act.assign(e, -1);
    recv_act.assign(e, -1);
    send_grad.assign(e, -1);
    recv_grad.assign(e, -1);
    optimizer.assign(stages, -1);
    all_reduce.assign(stages, -1);
  }

  long& slot(const Instruction& i) {
    const std::size_t stage_index = static_cast<std::size_t>(i.stage) * m + i.micro_batch;
    const std::size_t edge_index = static_cast<std::size_t>(i.edge) * m + i.micro_batch;
    switch (i.kind) {
      case OpKind::forward: return forward[stage_index];
      case OpKind::backward: return backward[stage_index];
      case OpKind::backward_input: return backward_input[stage_index];
      case OpKind::backward_weight: return backward_weight[stage_index];
      case OpKind::send_activation: return send_act[edge_index];
      case OpKind::recv_activation: return recv_act[edge_index];
      case OpKind::send_gradient: return send_grad[edge_index];
      case OpKind::recv_gradient: return recv_grad[edge_index];
      case OpKind::optimizer_step: return optimizer[i.stage];
      case OpKind::all_reduce: return all_reduce[i.stage];
    }
    throw ScheduleError("unknown instruction kind");
  }
};

// The stage at the instruction's end of its edge (which end depends on kind).
int own_end(const ScheduleEdge& e, OpKind kind) {
  return (kind == OpKind::send_activation || kind == OpKind::recv_gradient) ? e.src : e.dst;
}

std::vector<std::string> split_ws(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

int parse_int(const std::string& word, const std::string& what) {
  try {
    std::size_t used = 0;
    int value = std::stoi(word, &used);
    if (used == word.size()) return value;
  } catch (const std::exception&) {
  }
  throw FormatError("schedule text: " + what + ": expected an integer, found '" + word + "'");
}

}  // namespace

std::size_t Schedule::num_instructions() const {
  std::size_t n = 0;
  for (const auto& program : ranks) n += program.size();
  return n;
}

const std::vector<int>& Schedule::peer_ranks(const Instruction& t) const {
  const ScheduleEdge& e = edges.at(static_cast<std::size_t>(t.edge));
  switch (t.kind) {
    case OpKind::send_activation:
    case OpKind::recv_gradient: return stage_ranks.at(e.dst);
    case OpKind::recv_activation:
    case OpKind::send_gradient: return stage_ranks.at(e.src);
    default: throw ScheduleError(to_token(t) + " is not a transfer: it has no peer rank");
  }
}

int Schedule::peer_rank(const Instruction& t) const { return peer_ranks(t).front(); }

Schedule leads_only(const Schedule& s) {
  Schedule leads = s;
  for (const auto& ranks : s.stage_ranks) {
    for (std::size_t k = 1; k < ranks.size(); ++k) leads.ranks.at(ranks[k]).clear();
  }
  return leads;
}

void validate(const Schedule& s) {
  const int S = s.num_stages();
  const int M = s.num_micro_batches;
  const int R = s.num_ranks();
  const int E = static_cast<int>(s.edges.size());
  if (M < 1) throw ScheduleError("a schedule needs at least one micro-batch, found " + std::to_string(M));
  if (S < 1) throw ScheduleError("a schedule needs at least one stage");
  std::vector<int> stage_on_rank(std::max(R, 0), -1);
  if (static_cast<int>(s.stage_ranks.size()) != S) throw ScheduleError("internal: stage count");
  for (int st = 0; st < S; ++st) {
    if (s.stage_ranks[st].empty()) throw ScheduleError("stage " + std::to_string(st) + " has no rank");
    for (int r : s.stage_ranks[st]) {
      if (r < 0 || r >= R) {
        throw ScheduleError("stage " + std::to_string(st) + " is on rank " + std::to_string(r) +
                            ", outside the schedule's " + std::to_string(R) + " ranks");
      }
      if (stage_on_rank[r] >= 0) {
        throw ScheduleError("stages " + std::to_string(stage_on_rank[r]) + " and " +
                            std::to_string(st) + " are both on rank " + std::to_string(r) +
                            ": schedules support one stage per rank for now; give each stage "
                            "its own devices");
      }
      stage_on_rank[r] = st;
    }
    // Replicas run their lead's program (see the header): checked here, then only the leads'
    // programs are validated instruction by instruction.
    const int lead = s.stage_ranks[st].front();
    for (std::size_t k = 1; k < s.stage_ranks[st].size(); ++k) {
      const int r = s.stage_ranks[st][k];
      if (s.ranks[r] != s.ranks[lead]) {
        throw ScheduleError("rank " + std::to_string(r) + " runs a replica of stage " + std::to_string(st) +
                            ", so its program must equal that of the stage's lead, rank " +
                            std::to_string(lead) + " (replicas run the same schedule on their rows)");
      }
    }
  }
  std::vector<std::vector<int>> in_edges(S), out_edges(S);
  for (int e = 0; e < E; ++e) {
    const auto& edge = s.edges[e];
    if (edge.src < 0 || edge.dst >= S || edge.src >= edge.dst) {
      throw ScheduleError("edge " + std::to_string(e) + " (" + std::to_string(edge.src) + "->" +
                          std::to_string(edge.dst) +
                          ") must join two existing stages with src < dst (stages are numbered "
                          "in a topological order)");
    }
    out_edges[edge.src].push_back(e);
    in_edges[edge.dst].push_back(e);
  }

  Positions pos(S, E, M);
  for (int r = 0; r < R; ++r) {
    const auto& program = s.ranks[r];
    if (stage_on_rank[r] >= 0 && s.lead_rank(stage_on_rank[r]) != r) continue;  // a replica
    for (std::size_t step = 0; step < program.size(); ++step) {
      const Instruction& i = program[step];
      const std::string at = where(r, step, i);
      if (i.stage < 0 || i.stage >= S) throw ScheduleError(at + ": no stage " + std::to_string(i.stage));
      if (s.lead_rank(i.stage) != r) {
        throw ScheduleError(at + ": stage " + std::to_string(i.stage) + " runs on rank " +
                            std::to_string(s.lead_rank(i.stage)));
      }
      if (i.kind == OpKind::all_reduce && s.replicas(i.stage) < 2) {
        throw ScheduleError(at + ": stage " + std::to_string(i.stage) +
                            " runs on one rank, so it has no replicas' gradients to all-reduce");
      }
      if (has_micro_batch(i.kind) && (i.micro_batch < 0 || i.micro_batch >= M)) {
        throw ScheduleError(at + ": micro-batch out of range [0, " + std::to_string(M) + ")");
      }
      if (!has_micro_batch(i.kind)) {
        if (i.micro_batch != -1) throw ScheduleError(at + ": this instruction takes no micro-batch");
      }
      if (is_transfer(i.kind)) {
        if (i.edge < 0 || i.edge >= E) {
          throw ScheduleError(at + ": no edge " + std::to_string(i.edge) + " (the plan has " +
                              std::to_string(E) + ")");
        }
        const auto& edge = s.edges[i.edge];
        if (own_end(edge, i.kind) != i.stage) {
          throw ScheduleError(at + ": edge " + std::to_string(i.edge) + " runs " +
                              std::to_string(edge.src) + "->" + std::to_string(edge.dst) +
                              ", so a " + std::string(kind_name(i.kind)) + " on it belongs to stage " +
                              std::to_string(own_end(edge, i.kind)));
        }
      } else if (i.edge != -1) {
        throw ScheduleError(at + ": only sends and receives name an edge");
      }
      long& slot = pos.slot(i);
      if (slot >= 0) throw ScheduleError(at + ": appears twice (first at step " + std::to_string(slot) + ")");
      slot = static_cast<long>(step);
    }
  }

  // Completeness, then order on each rank.
  auto missing = [&](const Instruction& i) {
    return ScheduleError("rank " + std::to_string(s.lead_rank(i.stage)) + " lacks " +
                         to_token(i) + " (" + describe(i) + ")");
  };
  auto need_before = [&](const Instruction& first, const Instruction& then) {
    long a = pos.slot(first);
    long b = pos.slot(then);
    if (a < 0) throw missing(first);
    if (b < 0) throw missing(then);
    if (a > b) {
      throw ScheduleError(where(s.lead_rank(then.stage), static_cast<std::size_t>(b), then) +
                          ": the " + describe(then) + " comes before the " + describe(first) +
                          " (step " + std::to_string(a) + ") that it needs");
    }
  };
  // A micro-batch's backward is one B, or an I (input gradients) and later a W (weight
  // gradients): `grads(st, m)` is the one that produces the gradients sent back.
  auto grads = [&](int st, int m) -> Instruction {
    Instruction b{OpKind::backward, st, m, -1};
    Instruction in{OpKind::backward_input, st, m, -1};
    Instruction w{OpKind::backward_weight, st, m, -1};
    const bool split = pos.slot(in) >= 0 || pos.slot(w) >= 0;
    if (split && pos.slot(b) >= 0) {
      throw ScheduleError("rank " + std::to_string(s.lead_rank(st)) + " has both " + to_token(b) + " and the split " +
                          to_token(in) + "/" + to_token(w) + ": a micro-batch's backward is one or the other");
    }
    if (!split && pos.slot(b) < 0) {
      throw ScheduleError("rank " + std::to_string(s.lead_rank(st)) + " lacks " + to_token(b) + " (or " +
                          to_token(in) + " and " + to_token(w) + "): the backward of micro-batch " +
                          std::to_string(m) + " at stage " + std::to_string(st));
    }
    if (split) need_before(in, w);
    return split ? in : b;
  };
  // The instruction after which a micro-batch's weight gradients are final: B or W.
  auto weights_done = [&](int st, int m) -> Instruction {
    Instruction w{OpKind::backward_weight, st, m, -1};
    return pos.slot(w) >= 0 ? w : Instruction{OpKind::backward, st, m, -1};
  };
  for (int st = 0; st < S; ++st) {
    for (int m = 0; m < M; ++m) {
      Instruction f{OpKind::forward, st, m, -1};
      if (pos.slot(f) < 0) throw missing(f);
      const Instruction b = grads(st, m);
      for (int e : in_edges[st]) {
        need_before({OpKind::recv_activation, st, m, e}, f);
        need_before(b, {OpKind::send_gradient, st, m, e});
      }
      for (int e : out_edges[st]) {
        need_before(f, {OpKind::send_activation, st, m, e});
        need_before({OpKind::recv_gradient, st, m, e}, b);
      }
      need_before(f, b);
      if (m > 0) {
        need_before({OpKind::forward, st, m - 1, -1}, f);
        need_before(grads(st, m - 1), b);
      }
    }
    // The step, and a replicated stage's gradient sum before it, see every weight gradient.
    Instruction opt{OpKind::optimizer_step, st, -1, -1};
    Instruction sum{OpKind::all_reduce, st, -1, -1};
    for (int m = 0; m < M; ++m) {
      if (pos.slot(opt) >= 0) need_before(weights_done(st, m), opt);
      if (s.replicas(st) > 1) need_before(weights_done(st, m), sum);
    }
    if (s.replicas(st) > 1 && pos.slot(opt) >= 0) need_before(sum, opt);
  }
}

std::string Schedule::to_string() const {
  std::ostringstream out;
  out << "schedule " << (kind.empty() ? "manual" : kind) << ": " << num_stages() << " stages, "
      << num_micro_batches << " micro-batches, " << num_ranks() << " ranks\n";
  out << "stage ranks:";
  // A replicated stage prints as its ranks joined by commas: "stage ranks: 0,1 2".
  for (const auto& replicas : stage_ranks) {
    out << ' ';
    for (std::size_t k = 0; k < replicas.size(); ++k) out << (k ? "," : "") << replicas[k];
  }
  out << "\nedges:";
  for (const auto& e : edges) out << ' ' << e.src << "->" << e.dst;
  out << '\n';

  std::size_t columns = 0;
  for (const auto& program : ranks) columns = std::max(columns, program.size());
  std::vector<std::vector<std::string>> cells(ranks.size());
  std::vector<std::size_t> width(columns, 0);
  for (std::size_t j = 0; j < columns; ++j) width[j] = std::to_string(j).size();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (std::size_t j = 0; j < ranks[r].size(); ++j) {
      cells[r].push_back(to_token(ranks[r][j]));
      width[j] = std::max(width[j], cells[r].back().size());
    }
  }
  const std::size_t label = ("rank " + std::to_string(ranks.empty() ? 0 : ranks.size() - 1)).size();
  auto row = [&](const std::string& head, const std::vector<std::string>& items) {
    std::string line = head + std::string(label - head.size(), ' ') + " |";
    for (std::size_t j = 0; j < items.size(); ++j) {
      line += ' ';
      line += items[j];
      if (j + 1 < items.size()) line += std::string(width[j] - items[j].size(), ' ');
    }
    out << line << '\n';
  };
  std::vector<std::string> steps;
  for (std::size_t j = 0; j < columns; ++j) steps.push_back(std::to_string(j));
  row("step", steps);
  for (std::size_t r = 0; r < ranks.size(); ++r) row("rank " + std::to_string(r), cells[r]);
  return out.str();
}

std::string Schedule::compute_table() const {
  std::ostringstream out;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    out << "rank " << r << ":";
    for (const auto& i : ranks[r]) {
      if (i.kind == OpKind::forward || i.kind == OpKind::backward || i.kind == OpKind::backward_input ||
          i.kind == OpKind::backward_weight) {
        out << ' ' << kind_code(i.kind) << i.micro_batch;
      } else if (i.kind == OpKind::optimizer_step) {
        out << " OPT";
      } else if (i.kind == OpKind::all_reduce) {
        out << " AR";
      }
    }
    out << '\n';
  }
  return out.str();
}

Schedule parse(std::string_view text) {
  Schedule s;
  std::istringstream in{std::string(text)};
  std::string line;
  bool have_header = false, have_stage_ranks = false, have_edges = false;
  int declared_stages = 0;
  std::vector<bool> seen_rank;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    const std::string at = "schedule text line " + std::to_string(line_number);
    auto words = split_ws(line);
    if (words.empty() || words[0][0] == '#') continue;
    if (!have_header) {
      // schedule <kind>: <S> stages, <M> micro-batches, <R> ranks
      if (words.size() != 8 || words[0] != "schedule" || words[1].back() != ':' ||
          words[3] != "stages," || words[5] != "micro-batches," || words[7] != "ranks") {
        throw FormatError(at + ": expected 'schedule <kind>: <S> stages, <M> micro-batches, <R> "
                          "ranks', found '" + line + "'");
      }
      s.kind = words[1].substr(0, words[1].size() - 1);
      declared_stages = parse_int(words[2], at + " stages");
      s.num_micro_batches = parse_int(words[4], at + " micro-batches");
      int ranks = parse_int(words[6], at + " ranks");
      if (ranks < 0 || ranks > 1'000'000) throw FormatError(at + ": bad rank count");
      s.ranks.assign(ranks, {});
      seen_rank.assign(ranks, false);
      have_header = true;
    } else if (words[0] == "stage" && words.size() >= 2 && words[1] == "ranks:") {
      for (std::size_t k = 2; k < words.size(); ++k) {
        std::vector<int> replicas;
        std::size_t begin = 0;
        while (begin <= words[k].size()) {
          const std::size_t comma = std::min(words[k].find(',', begin), words[k].size());
          replicas.push_back(parse_int(words[k].substr(begin, comma - begin), at));
          begin = comma + 1;
        }
        s.stage_ranks.push_back(std::move(replicas));
      }
      have_stage_ranks = true;
    } else if (words[0] == "edges:") {
      for (std::size_t k = 1; k < words.size(); ++k) {
        auto arrow = words[k].find("->");
        if (arrow == std::string::npos) throw FormatError(at + ": bad edge '" + words[k] + "' (expected a->b)");
        s.edges.push_back({parse_int(words[k].substr(0, arrow), at), parse_int(words[k].substr(arrow + 2), at)});
      }
      have_edges = true;
    } else if (words[0] == "step") {
      continue;  // column numbers, for the reader
    } else if (words[0] == "rank" && words.size() >= 3 && words[2] == "|") {
      int r = parse_int(words[1], at);
      if (r < 0 || r >= s.num_ranks()) throw FormatError(at + ": rank " + words[1] + " out of range");
      if (seen_rank[r]) throw FormatError(at + ": rank " + words[1] + " listed twice");
      seen_rank[r] = true;
      for (std::size_t k = 3; k < words.size(); ++k) s.ranks[r].push_back(parse_token(words[k]));
    } else {
      throw FormatError(at + ": unexpected line '" + line + "'");
    }
  }
  if (!have_header) throw FormatError("schedule text: missing the 'schedule ...' header line");
  if (!have_stage_ranks) throw FormatError("schedule text: missing the 'stage ranks:' line");
  if (!have_edges) throw FormatError("schedule text: missing the 'edges:' line");
  if (s.num_stages() != declared_stages) {
    throw FormatError("schedule text: the header declares " + std::to_string(declared_stages) +
                      " stages but 'stage ranks:' lists " + std::to_string(s.num_stages()));
  }
  validate(s);
  return s;
}

}  // namespace graphpipe::schedule
