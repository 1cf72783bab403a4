#include "runtime/placement.h"

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

namespace trainer {

RankPlace this_place(int local_rank, int gpu) {
  const char* id = std::getenv("NCCL_HOSTID");
  return {host_name(), id ? id : "", local_rank, gpu};
}

std::vector<RankPlace> gather_places(const MpiCommunicator& world, const RankPlace& mine) {
  const auto rows = world.gather_strings_to_root(
      fmt::format("{} {}\n{}\n{}", mine.local_rank, mine.gpu, mine.host, mine.nccl_host));
  std::vector<RankPlace> places;
  for (const std::string& row : rows) {
    RankPlace p;
    std::istringstream in(row);
    in >> p.local_rank >> p.gpu;
    in.ignore(1);
    std::getline(in, p.host);
    std::getline(in, p.nccl_host);
    places.push_back(p);
  }
  return places;
}

int host_count(const std::vector<RankPlace>& places) {
  std::set<std::string> hosts;
  for (const RankPlace& p : places) hosts.insert(p.nccl_host.empty() ? p.host : p.nccl_host);
  return static_cast<int>(hosts.size());
}

std::vector<std::string> describe_places(const std::vector<RankPlace>& places) {
  std::vector<std::string> hosts;  // in order of their lowest rank
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(places.size()); ++r) {
    auto& on_host = ranks[places[r].host];
    if (on_host.empty()) hosts.push_back(places[r].host);
    on_host.push_back(r);
  }
  std::vector<std::string> lines;
  for (const std::string& h : hosts) {
    std::string line = fmt::format("{}: rank{}", h, ranks[h].size() > 1 ? "s" : "");
    for (size_t i = 0; i < ranks[h].size(); ++i) {
      const RankPlace& p = places[ranks[h][i]];
      line += fmt::format("{} {} (local {}{}{})", i ? "," : "", ranks[h][i], p.local_rank,
                          p.gpu >= 0 ? fmt::format(", GPU {}", p.gpu) : "",
                          p.nccl_host.empty() ? "" : ", NCCL host " + p.nccl_host);
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace trainer
