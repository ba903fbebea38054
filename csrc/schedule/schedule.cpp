#include "schedule/schedule.h"

#include <algorithm>
#include <sstream>

namespace graphpipe::schedule {

namespace {

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
    case OpKind::recv_gradient:
      return stage_ranks.at(e.dst);
    case OpKind::recv_activation:
    case OpKind::send_gradient:
      return stage_ranks.at(e.src);
    default:
      throw ScheduleError(to_token(t) + " is not a transfer: it has no peer rank");
  }
}

int Schedule::peer_rank(const Instruction& t) const { return peer_ranks(t).front(); }

bool Schedule::local(int edge) const {
  const ScheduleEdge& e = edges.at(static_cast<std::size_t>(edge));
  const auto& src = stage_ranks.at(static_cast<std::size_t>(e.src));
  const auto& dst = stage_ranks.at(static_cast<std::size_t>(e.dst));
  return src.size() == 1 && dst.size() == 1 && src.front() == dst.front();
}

Schedule leads_only(const Schedule& s) {
  Schedule leads = s;
  for (const auto& ranks : s.stage_ranks) {
    for (std::size_t k = 1; k < ranks.size(); ++k) leads.ranks.at(ranks[k]).clear();
  }
  return leads;
}

std::string Schedule::to_string() const {
  std::ostringstream out;
  out << "schedule " << (kind.empty() ? "manual" : kind) << ": " << num_stages() << " stages, " << num_micro_batches
      << " micro-batches, " << num_ranks() << " ranks\n";
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
      if (words.size() != 8 || words[0] != "schedule" || words[1].back() != ':' || words[3] != "stages," ||
          words[5] != "micro-batches," || words[7] != "ranks") {
        throw FormatError(at +
                          ": expected 'schedule <kind>: <S> stages, <M> micro-batches, <R> "
                          "ranks', found '" +
                          line + "'");
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
