// Point-to-point: sends and receives that do not pair up on (sender, receiver, p2pSeq).
#include "analysis/job_state.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/describe.h"

namespace ncclwatch::analysis::internal {
namespace {

// The bytes a send or receive moves: what its peer's side must match.
uint64_t transferBytes(const CallRecord& r) {
  return r.count * static_cast<uint64_t>(trace::dtypeBytes(r.dtype));
}

}  // namespace

// Per communicator; a partial pass keeps the verdicts of those it does not redo, unless it
// aligned them for the hang checks and the job's state they were drawn in changed.
uint64_t JobAnalysis::jobState() const {
  if (!stalled_ && deadRanks_.empty()) return 0;
  uint64_t h = trace::mix64(stalled_ ? 3 : 5);
  for (int p : deadRanks_) h = trace::mix64(h ^ static_cast<uint64_t>(p));
  return h | 1;
}

void JobAnalysis::checkP2p() {
  const uint64_t state = jobState();
  for (Comm& comm : comms_) {
    if (!redo(comm) && (!aligned(comm) || cache_->comms[comm.hash].jobState == state)) {
      const CommCache& kept = cache_->comms[comm.hash];
      verdicts_.insert(verdicts_.end(), kept.p2p.begin(), kept.p2p.end());
      continue;
    }
    size_t before = verdicts_.size();
    checkP2p(comm);
    if (cache_ == nullptr) continue;
    CommCache& kept = cache_->comms[comm.hash];
    kept.p2p.assign(verdicts_.begin() + static_cast<std::ptrdiff_t>(before), verdicts_.end());
    kept.jobState = state;
  }
}

void JobAnalysis::checkP2p(Comm& comm) {
  // (sender comm rank, receiver comm rank, p2pSeq) -> record, per direction
  struct Side {
    int member;
    uint32_t index;
  };
  size_t total = 0;
  for (const Member& m : comm.members) total += m.p2p.size();
  if (total == 0) return;
  // Per member: its sends to each peer and receives from each peer, in p2pSeq order.
  int count = static_cast<int>(comm.members.size());
  std::vector<std::unordered_map<int, std::vector<uint32_t>>> sendsTo(count), recvsFrom(count);
  for (int mi = 0; mi < count; ++mi) {
    const Member& m = comm.members[mi];
    int lastPeer = INT32_MIN;
    std::vector<uint32_t>* lastList = nullptr;
    bool lastSend = false;
    for (uint32_t i : m.p2p) {
      const CallRecord& r = procs_[m.proc].rec(i);
      if (r.p2pSeq == 0) continue;
      bool send = r.op == OpKind::kSend;
      if (lastList == nullptr || r.rootOrPeer != lastPeer || send != lastSend) {
        lastList = &(send ? sendsTo : recvsFrom)[mi][r.rootOrPeer];
        lastPeer = r.rootOrPeer;
        lastSend = send;
      }
      lastList->push_back(i);
    }
  }
  if (stalled_ && checkP2pOrderDeadlock(comm, sendsTo)) return;
  struct Item {
    Side side;
    std::string what;
    bool novel;
    std::string field;
    int absentPeer = -1;    // global rank of the peer that never posted the other side
    int absentMember = -1;  // and its member index
    bool held = false;      // the absent peer is held in an unmatched transfer of its own
  };
  std::vector<Item> items;
  std::vector<std::pair<int, int>> sizePairs;  // (sender, receiver) of each size mismatch
  bool oneSideOfEvery = false;  // one rank is on a side of every size mismatch: the culprit
  // A send or receive its stream never reached, queued behind an earlier call of its process
  // that is still pending, is not what anyone waits in: its peer's side may well come once that
  // call is done (ranks 1 and 2 already in the next step's gather, to rank 0, which still waits
  // for rank 3 in this one). Counted, they named rank 0 beside the rank that sent to the wrong
  // peer.
  auto queuedAhead = [&](int member, uint32_t index) {
    const int p = comm.members[member].proc;
    return procs_[p].rec(index).state == RecordState::kIssued && heldBehindAnEarlierCall(p, index);
  };
  // A send or receive issued after a collective its absent peer has not issued yet is not
  // unmatched either: the peer has not got there (held a step behind, by this hang). Stream order
  // cannot tell it when the sends and receives run on a stream of their own (PyTorch 2.15's
  // batch_isend_irecv) and wait for the collective by an event: a ring where one rank received
  // from the wrong peer named the two ranks that finished the step beside the one that broke it.
  auto peerBehind = [&](int member, uint32_t index, int peerMember) {
    if (peerMember < 0) return false;
    const Member& m = comm.members[member];
    for (size_t k = m.coll.size(); k-- > 0;) {  // its last collective before the call
      if (m.coll[k] == kNone || m.coll[k] > index) continue;
      return comm.members[peerMember].lastOrdinal() < m.base + k;
    }
    return false;
  };
  auto novel = [&](const Side& s) {
    return procs_[comm.members[s.member].proc].rec(s.index).p2pSeq == 1;
  };
  auto deadPeer = [&](int commRank) {
    int member = comm.byCommRank.find(commRank);
    return member < 0 || deadRanks_.count(comm.members[member].proc) > 0;
  };
  static const std::vector<uint32_t> kEmpty;
  // Pairs of ranks whose sends and receives carry the same sizes in another order (a tagged
  // exchange: NCCL ignores PyTorch's tags and pairs them in issue order).
  std::vector<std::string> reorderings;
  auto bytesList = [](const std::vector<uint64_t>& sizes) {
    std::string text;
    for (size_t i = 0; i < sizes.size(); ++i) {
      text += (i == 0 ? "" : i + 1 == sizes.size() ? " then " : ", ") + std::to_string(sizes[i]);
    }
    return text + " bytes";
  };
  for (int mi = 0; mi < count; ++mi) {
    const Member& sender = comm.members[mi];
    for (auto& [peer, sendList] : sendsTo[mi]) {
      int pm = comm.byCommRank.find(peer);
      const std::vector<uint32_t>* recvList = &kEmpty;
      int rj = -1;
      if (pm >= 0) {
        rj = pm;
        auto it = recvsFrom[rj].find(sender.commRank);
        if (it != recvsFrom[rj].end()) recvList = &it->second;
      }
      // both lists ascend in p2pSeq: walk them together
      size_t a = 0, b = 0;
      // The sizes of the pairs that disagree, in issue order: the same sizes in another order
      // on the two sides is a reordering, not a wrong size (below).
      std::vector<uint64_t> sentBytes, receivedBytes;
      while (a < sendList.size() || b < recvList->size()) {
        const CallRecord* sr =
            a < sendList.size() ? &procs_[sender.proc].rec(sendList[a]) : nullptr;
        const CallRecord* rr =
            b < recvList->size() ? &procs_[comm.members[rj].proc].rec((*recvList)[b]) : nullptr;
        if (sr && rr && sr->p2pSeq == rr->p2pSeq) {
          if (rr->count != sr->count || rr->dtype != sr->dtype) {
            std::string field = rr->count != sr->count ? "count" : "dtype";
            items.push_back({{mi, sendList[a]},
                             "its receiver posted " +
                                 callText(describe(procs_[comm.members[rj].proc], (*recvList)[b])),
                             false,
                             field});
            items.push_back({{rj, (*recvList)[b]}, "does not match the send", false, field});
            sentBytes.push_back(transferBytes(*sr));
            receivedBytes.push_back(transferBytes(*rr));
            sizePairs.push_back({procs_[sender.proc].rank, globalRank(comm, peer)});
          }
          ++a;
          ++b;
        } else if (sr && (!rr || sr->p2pSeq < rr->p2pSeq)) {
          if (stalled_ && isPending(*sr) && rj >= 0 && !deadPeer(peer) &&
              !queuedAhead(mi, sendList[a]) && !peerBehind(mi, sendList[a], rj)) {
            Side side{mi, sendList[a]};
            items.push_back({side,
                             "rank " + std::to_string(globalRank(comm, peer)) +
                                 " never posts the matching Recv",
                             novel(side), "", globalRank(comm, peer), rj});
          }
          ++a;
        } else {
          if (stalled_ && isPending(*rr) && !deadPeer(sender.commRank) &&
              !queuedAhead(rj, (*recvList)[b]) && !peerBehind(rj, (*recvList)[b], mi)) {
            Side side{rj, (*recvList)[b]};
            items.push_back({side,
                             "rank " + std::to_string(procs_[sender.proc].rank) + " never sends it",
                             novel(side), "", procs_[sender.proc].rank, mi});
          }
          ++b;
        }
      }
      if (sentBytes.size() >= 2) {
        std::vector<uint64_t> sent = sentBytes, received = receivedBytes;
        std::sort(sent.begin(), sent.end());
        std::sort(received.begin(), received.end());
        if (sent == received) {
          reorderings.push_back(
              "rank " + std::to_string(procs_[sender.proc].rank) + " sends rank " +
              std::to_string(globalRank(comm, peer)) + " " + bytesList(sentBytes) + " and rank " +
              std::to_string(globalRank(comm, peer)) + " receives " + bytesList(receivedBytes));
        }
      }
    }
  }
  // receives from a peer that never sent to this rank at all
  for (int mi = 0; mi < count; ++mi) {
    const Member& receiver = comm.members[mi];
    for (auto& [peer, recvList] : recvsFrom[mi]) {
      int pm = comm.byCommRank.find(peer);
      if (pm < 0) continue;
      if (sendsTo[pm].count(receiver.commRank)) continue;  // walked above
      for (uint32_t i : recvList) {
        const CallRecord& rr = procs_[receiver.proc].rec(i);
        if (stalled_ && isPending(rr) && !deadPeer(peer) && !queuedAhead(mi, i) &&
            !peerBehind(mi, i, pm)) {
          Side side{mi, i};
          items.push_back({side,
                           "rank " + std::to_string(globalRank(comm, peer)) + " never sends it",
                           novel(side), "", globalRank(comm, peer), pm});
        }
      }
    }
  }
  if (items.empty()) return;
  // A rank that waits for a peer held in an unmatched transfer of its own, a peer that has not
  // finished the step in which it served this rank's previous transfer the same way, waits
  // because of it: the peer has not got here (a ring where one rank sent to the wrong peer: the
  // ranks that finished the step wait in the next one for the ranks still in it). Counted, they
  // named an innocent rank beside the culprit.
  std::vector<bool> waitsUnmatched(static_cast<size_t>(count), false);
  for (const Item& item : items) {
    if (item.field.empty()) waitsUnmatched[static_cast<size_t>(item.side.member)] = true;
  }
  auto previousStillPending = [&](const Item& item) {
    const Member& m = comm.members[item.side.member];
    const CallRecord& mine = procs_[m.proc].rec(item.side.index);
    if (mine.p2pSeq <= 1) return false;
    const Member& peer = comm.members[item.absentMember];
    const auto& lists = mine.op == OpKind::kSend ? recvsFrom : sendsTo;
    auto list = lists[static_cast<size_t>(item.absentMember)].find(m.commRank);
    if (list == lists[static_cast<size_t>(item.absentMember)].end()) return false;
    for (uint32_t i : list->second) {
      const CallRecord& theirs = procs_[peer.proc].rec(i);
      if (theirs.p2pSeq == mine.p2pSeq - 1) return isPending(theirs);
    }
    return false;
  };
  for (Item& item : items) {
    if (!item.field.empty() || item.absentMember < 0) continue;
    if (!waitsUnmatched[static_cast<size_t>(item.absentMember)] || !previousStillPending(item)) {
      continue;
    }
    item.held = true;
  }
  // Ranks that hold each other so (each waiting for a step the other has not finished) leave no
  // cause: then every wait stands as itself.
  const bool causeLeft = std::any_of(items.begin(), items.end(), [](const Item& item) {
    return item.field.empty() && !item.held;
  });
  for (Item& item : items) {
    if (!item.held) continue;
    if (!causeLeft) {
      item.held = false;
      continue;
    }
    item.what = "waits for rank " + std::to_string(item.absentPeer) +
                ", which is held in a transfer of its own";
  }
  std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    const Proc& pa = procs_[comm.members[a.side.member].proc];
    const Proc& pb = procs_[comm.members[b.side.member].proc];
    return std::make_tuple(pa.rec(a.side.index).op, pa.rank, pa.rec(a.side.index).seq) <
           std::make_tuple(pb.rec(b.side.index).op, pb.rank, pb.rec(b.side.index).seq);
  });
  // The fewest ranks that explain every unmatched call: each unmatched call is a pair (its
  // rank, the peer that never posted the other side), and a rank in every pair (a wrong peer
  // leaves both the peer it used and the one it should have used waiting) explains them all.
  // A greedy cover; a tie goes to the rank that never posted its side.
  auto p2pCoverCulprits = [&](const std::vector<Item>& list) {
    std::vector<std::pair<int, int>> pairs;  // (rank with the call, absent peer)
    for (const Item& item : list) {
      if (item.field.empty() && item.absentPeer >= 0 && !item.held) {
        pairs.push_back({procs_[comm.members[item.side.member].proc].rank, item.absentPeer});
      }
    }
    std::set<int> chosen;
    std::vector<bool> covered(pairs.size(), false);
    for (;;) {
      std::map<int, std::pair<int, int>> score;  // rank -> (pairs it covers, pairs absent)
      for (size_t i = 0; i < pairs.size(); ++i) {
        if (covered[i]) continue;
        ++score[pairs[i].first].first;
        ++score[pairs[i].second].first;
        ++score[pairs[i].second].second;
      }
      if (score.empty()) break;
      auto best = score.begin();
      for (auto it = score.begin(); it != score.end(); ++it) {
        if (it->second > best->second) best = it;
      }
      chosen.insert(best->first);
      for (size_t i = 0; i < pairs.size(); ++i) {
        covered[i] = covered[i] || pairs[i].first == best->first || pairs[i].second == best->first;
      }
    }
    return chosen;
  };
  // A send and receive of different sizes: the side whose size no other transfer on the
  // communicator uses is the odd one; when that does not tell, both.
  auto p2pSizeCulprits = [&](const Comm& c, const std::vector<Item>& list) {
    // One rank on a side of every mismatched pair explains them all (an all_to_all_single whose
    // rank 1 kept last step's output splits: its four receives disagree with four senders, whose
    // sizes no rule of "the usual size" can judge: exp24's a2a named ranks 0-1,3).
    if (sizePairs.size() >= 2) {
      std::set<int> inAll = {sizePairs.front().first, sizePairs.front().second};
      for (const std::pair<int, int>& pair : sizePairs) {
        std::erase_if(inAll, [&](int rank) { return rank != pair.first && rank != pair.second; });
      }
      if (inAll.size() == 1) {
        oneSideOfEvery = true;
        return inAll;
      }
    }
    std::map<uint64_t, int> sizes;  // bytes -> transfers of that size
    for (const Member& m : c.members) {
      for (uint32_t i : m.p2p) {
        const CallRecord& r = procs_[m.proc].rec(i);
        ++sizes[transferBytes(r)];
      }
    }
    uint64_t usual = std::max_element(sizes.begin(), sizes.end(), [](auto& a, auto& b) {
                       return a.second < b.second;
                     })->first;
    std::set<int> odd, all;
    for (const Item& item : list) {
      if (item.field.empty()) continue;
      const Proc& proc = procs_[c.members[item.side.member].proc];
      const CallRecord& r = proc.rec(item.side.index);
      all.insert(proc.rank);
      if (transferBytes(r) != usual) {
        odd.insert(proc.rank);
      }
    }
    return odd.empty() || odd == all ? all : odd;
  };
  uint64_t seq = UINT64_MAX;
  Verdict v = make(VerdictKind::kUnmatchedP2p, &comm, 0);
  std::set<std::string> fields;
  for (const Item& item : items) {
    if (!item.field.empty()) fields.insert(item.field);
  }
  std::set<int> culprits = fields.empty() ? p2pCoverCulprits(items) : p2pSizeCulprits(comm, items);
  int64_t divergence = INT64_MAX;
  for (const Item& item : items) {
    const Proc& proc = procs_[comm.members[item.side.member].proc];
    RankClass rc;
    rc.ranks = {proc.rank};
    rc.call = describe(proc, item.side.index);
    // the peer as a global rank, so users read one numbering
    rc.call.rootOrPeer = globalRank(comm, rc.call.rootOrPeer);
    rc.call.note = item.what;
    seq = std::min(seq, rc.call.seq);
    bool involvesCulprit = culprits.count(proc.rank) || culprits.count(item.absentPeer);
    if (involvesCulprit) {
      divergence = std::min(divergence, proc.wall(proc.rec(item.side.index).issueNs));
    }
    if (v.classes.size() < 16) v.classes.push_back(std::move(rc));
  }
  // A send's or receive's seq is its rank's own count: the header's "call #N" is the culprit's
  // call where it has one (the lowest seq of all read as another rank's numbering).
  for (const RankClass& rc : v.classes) {
    if (rc.ranks.size() == 1 && culprits.count(rc.ranks.front()) != 0 && rc.call.seq != 0) {
      seq = rc.call.seq;
      break;
    }
  }
  v.seq = seq;
  v.fields.assign(fields.begin(), fields.end());
  v.culprits.assign(culprits.begin(), culprits.end());
  v.divergenceNs = divergence == INT64_MAX ? 0 : divergence;
  std::string who = namedRanks(v.culprits);
  // A rank that sends to (receives from) one peer where another waits for that transfer: the
  // two unmatched sides of the same size, one of them the culprit's.
  auto wrongPeerText = [&](int culprit) -> std::string {
    auto bytes = [&](const Item& item) {
      return transferBytes(procs_[comm.members[item.side.member].proc].rec(item.side.index));
    };
    auto rankOf = [&](const Item& item) {
      return procs_[comm.members[item.side.member].proc].rank;
    };
    auto opOf = [&](const Item& item) {
      return procs_[comm.members[item.side.member].proc].rec(item.side.index).op;
    };
    for (const Item& mine : items) {
      if (!mine.field.empty() || mine.held || rankOf(mine) != culprit) continue;
      for (const Item& other : items) {
        if (!other.field.empty() || other.held || other.absentPeer != culprit ||
            rankOf(other) == mine.absentPeer || opOf(other) == opOf(mine) ||
            bytes(other) != bytes(mine)) {
          continue;
        }
        std::string c = std::to_string(culprit), wrong = std::to_string(mine.absentPeer),
                    right = std::to_string(rankOf(other)), size = std::to_string(bytes(mine));
        if (opOf(mine) == OpKind::kSend) {
          return "rank " + c + " sends " + size + " bytes to rank " + wrong +
                 ", which never receives from it, while rank " + right + " waits for " + size +
                 " bytes from rank " + c + " (did it mean rank " + right + "?)";
        }
        return "rank " + c + " waits for " + size + " bytes from rank " + wrong +
               ", which never sends to it, while rank " + right + " sends " + size +
               " bytes to rank " + c + " (did it mean rank " + right + "?)";
      }
    }
    return {};
  };
  // The other reading of a rank that never posts its side, where it never takes that side with
  // any rank (no receive at all, where it is sent to) and each unmatched transfer is its pair's
  // first: the rank talking to it has the wrong peer. A ring whose rank 3 skips its receive and
  // a pipeline whose last stage sends "to the next stage", (rank + 1) % world, to rank 0, which
  // only ever sends, leave the same calls (exp24's pipewrap named rank 0 alone). Only where the
  // silent rank's window holds its whole history, and one rank talks to it; "" where it does not
  // apply.
  auto strangerReading = [&](int silent) -> std::string {
    std::string reading;
    int talker = -1;
    for (const Item& item : items) {
      if (!item.field.empty() || item.held) continue;
      const Proc& proc = procs_[comm.members[item.side.member].proc];
      const CallRecord& mine = proc.rec(item.side.index);
      if (item.absentPeer != silent || mine.p2pSeq != 1 || item.absentMember < 0) return {};
      const Member& peer = comm.members[item.absentMember];
      const OpKind otherSide = mine.op == OpKind::kSend ? OpKind::kRecv : OpKind::kSend;
      bool stranger = peer.base <= 1 && procs_[peer.proc].file->foldedLatestNs == 0 &&
                      std::none_of(peer.p2p.begin(), peer.p2p.end(), [&](uint32_t i) {
                        return procs_[peer.proc].rec(i).op == otherSide;
                      });
      if (!stranger) return {};
      // Several ranks sending to one that never receives are one pattern (a gather it does not
      // join: exp24's gathermix), not each a wrong peer.
      if (talker >= 0 && talker != proc.rank) return {};
      talker = proc.rank;
      if (!reading.empty()) continue;
      std::string me = std::to_string(proc.rank), them = std::to_string(silent);
      reading = mine.op == OpKind::kSend
                    ? "; or, as rank " + them + " never receives from any rank, rank " + me +
                          " sends to the wrong peer (a pipeline's last stage has no next stage)"
                    : "; or, as rank " + them + " never sends to any rank, rank " + me +
                          " receives from the wrong peer (a pipeline's first stage has no "
                          "previous stage)";
    }
    return reading;
  };
  size_t unmatched = 0;
  bool culpritAbsentEverywhere = v.culprits.size() == 1;
  for (const Item& item : items) {
    if (!item.field.empty() || item.held) continue;
    ++unmatched;
    culpritAbsentEverywhere = culpritAbsentEverywhere && item.absentPeer == v.culprits.front();
  }
  const std::string swappedPeer =
      fields.empty() && v.culprits.size() == 1 ? wrongPeerText(v.culprits.front()) : "";
  if (!fields.empty() && !reorderings.empty()) {
    std::string pairs;
    for (size_t i = 0; i < reorderings.size() && i < 4; ++i)
      pairs += (i ? "; " : "") + reorderings[i];
    v.explanation = "the same sizes in another order (" + pairs +
                    "): NCCL pairs a rank's sends to a peer with that peer's receives in the "
                    "order they are issued, and ignores tags (PyTorch's tag= is not sent): issue "
                    "them in the same order on both sides";
  } else if (!fields.empty() && oneSideOfEvery) {
    v.explanation = "a send and its receive disagree on " + *fields.begin() + " in " +
                    std::to_string(sizePairs.size()) + " transfers, each with " + who +
                    " on one side: its sizes are the likely wrong ones (an all_to_all's split "
                    "sizes from another step?); sender and receiver must pass the same count and "
                    "dtype";
  } else if (!fields.empty()) {
    v.explanation = "a send and its receive disagree on " + *fields.begin() + "; " + who +
                    (v.culprits.size() == 1 ? " passes" : " pass") +
                    " a size the others do not use: sender and receiver must pass the same "
                    "count and dtype";
  } else if (v.culprits.size() == 1 && culpritAbsentEverywhere) {
    const std::string otherReading = strangerReading(v.culprits.front());
    if (!otherReading.empty()) {
      v.confidence *= 0.75;
      v.doubts.push_back("which side is wrong the calls cannot tell: " + who +
                         " never takes that side with any rank");
    }
    // Where the rank that never posts its side is instead: the call it waits in (a collective
    // it went on to, believing it had nothing to send), or that it waits in none.
    for (const Member& m : comm.members) {
      if (procs_[m.proc].rank != v.culprits.front()) continue;
      RankClass where;
      where.ranks = {v.culprits.front()};
      where.call = whereIs(m.proc);
      where.call.note = "never posts its side; " + where.call.note;
      v.classes.push_back(std::move(where));
      break;
    }
    v.explanation = who + " never posts its side of " +
                    (unmatched == 1 ? std::string("a transfer its peer waits in")
                                    : std::to_string(unmatched) + " transfers its peers wait in") +
                    " (rank i's k-th send to j needs j's k-th receive from i): look for the "
                    "send or receive " +
                    who + " skips" + otherReading;
  } else if (!swappedPeer.empty()) {
    v.explanation = swappedPeer + ": check how " + who + " computes its peers";
  } else if (v.culprits.size() == 1) {
    v.explanation = "every one of the " + std::to_string(unmatched) +
                    " unmatched sends and receives involves " + who +
                    ": it talks to a peer "
                    "that does not expect it, so the peer it should have talked to waits in "
                    "vain; check how " +
                    who + " computes its peers";
  } else {
    v.explanation =
        "sends and receives do not pair up (rank i's k-th send to j needs j's k-th "
        "receive from i), and no one rank is in all of them: check the peers of " +
        who;
  }
  if (v.fields.empty()) restsOnTiming(v);
  verdicts_.push_back(std::move(v));
}

bool JobAnalysis::checkP2pOrderDeadlock(
    const Comm& comm, const std::vector<std::unordered_map<int, std::vector<uint32_t>>>& sendsTo) {
  const int count = static_cast<int>(comm.members.size());
  // waitsOn[m]: the member m's first pending send or receive waits for, when it has started
  // and the peer's matching call has not: the peer's stream holds it behind a call of its own
  // still pending, of another group. A receive waits for its send (PyTorch's dist.recv only
  // makes the stream wait, so the host goes on to issue the send behind it); a send waits for
  // its receive once the message is past what NCCL completes without one (its buffers).
  std::vector<P2pWait> waitsOn(static_cast<size_t>(count));
  for (int mi = 0; mi < count; ++mi) {
    const Member& m = comm.members[mi];
    const Proc& proc = procs_[m.proc];
    auto first = std::find_if(m.p2p.begin(), m.p2p.end(),
                              [&](uint32_t i) { return isPending(proc.rec(i)); });
    if (first == m.p2p.end()) continue;
    const CallRecord& mine = proc.rec(*first);
    if (mine.state != RecordState::kStarted || mine.p2pSeq == 0) continue;
    const bool sendFirst = mine.op == OpKind::kSend;
    int pm = comm.byCommRank.find(mine.rootOrPeer);
    if (pm < 0) continue;
    const Member& peer = comm.members[pm];
    const Proc& peerProc = procs_[peer.proc];
    // The peer's matching call: its send to m (receive first), its receive from m (send first).
    uint32_t match = kNone;
    if (!sendFirst) {
      auto sends = sendsTo[pm].find(m.commRank);
      if (sends == sendsTo[pm].end()) continue;
      for (uint32_t s : sends->second) {
        if (peerProc.rec(s).p2pSeq == mine.p2pSeq) match = s;
      }
    } else {
      for (uint32_t r : peer.p2p) {
        const CallRecord& recv = peerProc.rec(r);
        if (recv.op == OpKind::kRecv && recv.rootOrPeer == m.commRank &&
            recv.p2pSeq == mine.p2pSeq) {
          match = r;
        }
      }
    }
    if (match == kNone) continue;
    const CallRecord& theirs = peerProc.rec(match);
    if (theirs.state != RecordState::kIssued || !isPending(theirs)) continue;  // it runs
    for (uint32_t a : peer.p2p) {
      const CallRecord& ahead = peerProc.rec(a);
      if (ahead.seq >= theirs.seq) break;
      if (isPending(ahead) && ahead.stream == theirs.stream) {
        // One group (batch_isend_irecv) runs its calls as one launch: not held behind. Where
        // the records do not tell (files before session 20, the plugin's records), a receive
        // first is claimed as before; a send first is not: a group's second call, its start
        // inferred from stream order, looks the same.
        const bool grouped = (ahead.flags & theirs.flags & trace::kRecordInGroup) != 0;
        const bool known = ahead.groupSerial != 0 && theirs.groupSerial != 0;
        const bool oneGroup = grouped && (known ? sameGroup(ahead, theirs) : sendFirst);
        if (!oneGroup) waitsOn[static_cast<size_t>(mi)] = P2pWait{pm, *first, match, a, sendFirst};
        break;
      }
    }
  }
  // Each member waits on one peer at most: a cycle is found by walking from each member, each
  // member walked once in all (a walk that reaches one an earlier walk passed finds nothing
  // new), so a communicator of 32,768 members costs one pass, not one per member.
  // Every cycle (pairs that each send first: one verdict each).
  std::vector<std::vector<int>> cycles;
  std::vector<int> walkedFrom(static_cast<size_t>(count), -1);
  for (int start = 0; start < count; ++start) {
    int at = start;
    while (at >= 0 && walkedFrom[static_cast<size_t>(at)] < 0 &&
           waitsOn[static_cast<size_t>(at)].peer >= 0) {
      walkedFrom[static_cast<size_t>(at)] = start;
      at = waitsOn[static_cast<size_t>(at)].peer;
    }
    if (at < 0 || walkedFrom[static_cast<size_t>(at)] != start) continue;
    std::vector<int>& cycle = cycles.emplace_back();
    for (int member = at;;) {  // back at a member of this walk: the cycle runs from it
      cycle.push_back(member);
      member = waitsOn[static_cast<size_t>(member)].peer;
      if (member == at) break;
    }
  }
  for (const std::vector<int>& cycle : cycles) sayP2pOrderDeadlock(comm, cycle, waitsOn);
  return !cycles.empty();
}

void JobAnalysis::sayP2pOrderDeadlock(const Comm& comm, const std::vector<int>& cycle,
                                      const std::vector<P2pWait>& waitsOn) {
  Verdict v = make(VerdictKind::kDeadlock, &comm, 0);
  uint64_t seq = UINT64_MAX;
  int64_t closed = 0;
  std::vector<int> ranks;
  size_t sendsFirst = 0;
  for (int mi : cycle) {
    const P2pWait& wait = waitsOn[static_cast<size_t>(mi)];
    const Proc& proc = procs_[comm.members[mi].proc];
    const Proc& peerProc = procs_[comm.members[wait.peer].proc];
    RankClass rc;
    rc.ranks = {proc.rank};
    rc.call = describe(proc, wait.mine);
    rc.call.rootOrPeer = peerProc.rank;  // its peer, as a global rank
    // Peers as global ranks, as everywhere users read them.
    CallDesc theirs = describe(peerProc, wait.theirs), ahead = describe(peerProc, wait.ahead);
    theirs.rootOrPeer = globalRank(comm, theirs.rootOrPeer);
    ahead.rootOrPeer = globalRank(comm, ahead.rootOrPeer);
    rc.call.note = "waits for rank " + std::to_string(peerProc.rank) + "'s " + callText(theirs) +
                   ", which its stream holds behind its " + callText(ahead);
    seq = std::min(seq, rc.call.seq);
    closed = std::max(closed, proc.wall(proc.rec(wait.mine).issueNs));
    sendsFirst += wait.sendFirst ? 1 : 0;
    ranks.push_back(proc.rank);
    v.classes.push_back(std::move(rc));
  }
  std::sort(ranks.begin(), ranks.end());
  v.seq = seq;
  v.culprits = ranks;
  v.divergenceNs = closed;
  std::string who = formatRanks(ranks);
  const bool pair = ranks.size() == 2;
  if (sendsFirst == 0) {
    v.explanation =
        (pair ? "ranks " + who + " each receive from the other before they send to it"
              : "ranks " + who + " each receive from the next before they send on") +
        ", the send behind the receive on one stream: every receive waits for a send its peer's "
        "stream runs only after that peer's own receive, a deadlock in which no send or receive "
        "is missing. Issue each rank's sends and receives together (ncclGroupStart/ncclGroupEnd; "
        "batch_isend_irecv in PyTorch), or let one side send first";
  } else if (sendsFirst == cycle.size()) {
    v.explanation =
        (pair ? "ranks " + who + " each send to the other before they receive from it"
              : "ranks " + who + " each send to the next before they receive") +
        ", the receive behind the send on one stream: a send this large waits for its receive "
        "(NCCL completes a send without one only while the message fits its buffers), which its "
        "peer's stream runs only after that peer's own send, a deadlock in which no send or "
        "receive is missing. Issue each rank's sends and receives together "
        "(ncclGroupStart/ncclGroupEnd; batch_isend_irecv in PyTorch), or let one side receive "
        "first";
  } else {
    v.explanation = "ranks " + who +
                    " each wait for a send or receive their peer's stream holds behind a call "
                    "of its own, a deadlock in which no send or receive is missing. Issue each "
                    "rank's sends and receives together (ncclGroupStart/ncclGroupEnd; "
                    "batch_isend_irecv in PyTorch)";
  }
  verdicts_.push_back(std::move(v));
}

}  // namespace ncclwatch::analysis::internal
