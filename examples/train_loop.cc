// A hybrid-parallel training step in NCCL calls, with bugs that can be injected.
//
// Communicators: the world (ncclCommInitRank), tensor-parallel groups of --tp consecutive ranks
// and data-parallel groups of ranks with the same TP index (both ncclCommSplit of the world).
// At start, rank 0 broadcasts the parameters. Each step, on one stream:
//   1. TP allreduce of activations;
//   2. DP allreduce of three gradient buckets of different sizes;
//   3. DP allgather and reducescatter (sharded optimizer);
//   4. a pipeline ring on the world: send to the next DP stage, receive from the previous one;
//   5. a broadcast of the learning rate from world rank 0;
//   6. a one-element barrier-like allreduce on the world.
// Then it synchronizes and checks every result exactly (all values are small integers).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/launch_env.h"

namespace {

using examples::LaunchEnv;

constexpr const char* kUsage =
    "usage: train_loop [--steps N] [--tp N] [--bucket-kib N] [--step-ms N] [--verbose] [--quiet]\n"
    "                  [--bug KIND:rank=R,step=S[,ms=N]]...\n"
    "Rank and world come from torchrun, OpenMPI or SLURM variables. --step-ms: host compute\n"
    "  time at the start of every step on every rank (no NCCL call pending meanwhile).\n"
    "Bug kinds (each on rank R at step S): skip, op, count, dtype, root, extra, peer,\n"
    "  color (at the split; step ignored), order, exit, crash, slow (ms=N per call),\n"
    "  pause (ms=N once, before the step's calls: a long host pause).\n"
    "Every kind but slow and pause makes the job hang, as it would on GPUs.\n";

enum class BugKind {
  kSkip,
  kOp,
  kCount,
  kDtype,
  kRoot,
  kExtra,
  kPeer,
  kColor,
  kOrder,
  kExit,
  kCrash,
  kSlow,
  kPause
};

struct Bug {
  BugKind kind;
  int rank = 0;
  int step = 0;
  int ms = 100;
};

struct Options {
  int steps = 10;
  int tp = 0;  // 0: 2 when the world size is even, else 1
  int bucketKib = 16;
  int stepMs = 0;
  bool verbose = false;
  bool quiet = false;
  std::vector<Bug> bugs;
};

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "train_loop: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

int parseCount(const std::string& text, const std::string& what) {
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 0 || value > 1 << 30) {
    usageError(what + " must be a non-negative integer, got '" + text + "'");
  }
  return static_cast<int>(value);
}

Bug parseBug(const std::string& spec) {
  static const std::pair<const char*, BugKind> kKinds[] = {
      {"skip", BugKind::kSkip},   {"op", BugKind::kOp},       {"count", BugKind::kCount},
      {"dtype", BugKind::kDtype}, {"root", BugKind::kRoot},   {"extra", BugKind::kExtra},
      {"peer", BugKind::kPeer},   {"color", BugKind::kColor}, {"order", BugKind::kOrder},
      {"exit", BugKind::kExit},   {"crash", BugKind::kCrash}, {"slow", BugKind::kSlow},
      {"pause", BugKind::kPause}};
  size_t colon = spec.find(':');
  std::string kindName = spec.substr(0, colon);
  Bug bug{};
  bool known = false;
  for (auto& [name, kind] : kKinds) {
    if (kindName == name) {
      bug.kind = kind;
      known = true;
    }
  }
  if (!known) usageError("--bug: unknown kind '" + kindName + "'");
  bool haveRank = false;
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    size_t equals = item.find('=');
    if (equals == std::string::npos) usageError("--bug: '" + item + "' is not key=value");
    std::string key = item.substr(0, equals), value = item.substr(equals + 1);
    if (key == "rank") {
      bug.rank = parseCount(value, "--bug rank");
      haveRank = true;
    } else if (key == "step") {
      bug.step = parseCount(value, "--bug step");
    } else if (key == "ms") {
      bug.ms = parseCount(value, "--bug ms");
    } else {
      usageError("--bug: unknown key '" + key + "'");
    }
  }
  if (!haveRank) usageError("--bug " + kindName + " needs rank=R");
  return bug;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--steps") {
      options.steps = parseCount(value(), "--steps");
    } else if (arg == "--tp") {
      options.tp = parseCount(value(), "--tp");
    } else if (arg == "--step-ms") {
      options.stepMs = parseCount(value(), "--step-ms");
    } else if (arg == "--bucket-kib") {
      options.bucketKib = parseCount(value(), "--bucket-kib");
    } else if (arg == "--bug") {
      options.bugs.push_back(parseBug(value()));
    } else if (arg == "--verbose") {
      options.verbose = true;
    } else if (arg == "--quiet") {
      options.quiet = true;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usageError("unknown argument '" + arg + "'");
    }
  }
  if (options.bucketKib < 1) usageError("--bucket-kib must be at least 1");
  return options;
}

// A device buffer of floats with a host mirror for filling and checking.
struct Buffer {
  float* device = nullptr;
  std::vector<float> host;
  size_t count() const { return host.size(); }
};

class TrainLoop {
 public:
  TrainLoop(const LaunchEnv& env, const Options& options) : env_(env), options_(options) {}

  int run() {
    setUp();
    for (int step = 0; step < options_.steps; ++step) {
      if (!runStep(step)) return 3;
    }
    tearDown();
    if (env_.rank == 0 && !options_.quiet) {
      std::printf("train_loop: %d steps verified on %d ranks (tp %d, dp %d)\n", options_.steps,
                  env_.world, tp_, dp_);
    }
    return 0;
  }

 private:
  const Bug* bugAt(BugKind kind, int step) const {
    for (const Bug& bug : options_.bugs) {
      if (bug.kind == kind && bug.rank == env_.rank &&
          (kind == BugKind::kColor || bug.step == step)) {
        return &bug;
      }
    }
    return nullptr;
  }

  // Called before every NCCL call of a step, for the slow-rank bug.
  void pace(int step) const {
    for (const Bug& bug : options_.bugs) {
      if (bug.kind == BugKind::kSlow && bug.rank == env_.rank && step >= bug.step) {
        std::this_thread::sleep_for(std::chrono::milliseconds(bug.ms));
      }
    }
  }

  Buffer allocate(size_t count) {
    Buffer buffer;
    buffer.host.assign(count, 0.0f);
    EXAMPLE_CUDA_CHECK(env_, cudaMalloc(reinterpret_cast<void**>(&buffer.device),
                                        std::max<size_t>(count, 1) * sizeof(float)));
    return buffer;
  }

  void upload(Buffer& buffer) {
    EXAMPLE_CUDA_CHECK(
        env_, cudaMemcpyAsync(buffer.device, buffer.host.data(), buffer.count() * sizeof(float),
                              cudaMemcpyHostToDevice, stream_));
  }

  void download(Buffer& buffer) {
    EXAMPLE_CUDA_CHECK(
        env_, cudaMemcpyAsync(buffer.host.data(), buffer.device, buffer.count() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_));
  }

  void setUp() {
    tp_ = options_.tp > 0 ? options_.tp : (env_.world % 2 == 0 ? 2 : 1);
    if (env_.world % tp_ != 0) usageError("--tp must divide the world size");
    dp_ = env_.world / tp_;
    int devices = 0;
    EXAMPLE_CUDA_CHECK(env_, cudaGetDeviceCount(&devices));
    EXAMPLE_CUDA_CHECK(env_, cudaSetDevice(env_.localRank % devices));
    EXAMPLE_CUDA_CHECK(env_, cudaStreamCreate(&stream_));
    ncclUniqueId id = examples::shareUniqueId(env_);
    EXAMPLE_NCCL_CHECK(env_, ncclCommInitRank(&world_, env_.world, id, env_.rank));

    int tpColor = env_.rank / tp_;
    if (bugAt(BugKind::kColor, 0) != nullptr) tpColor = (tpColor + 1) % dp_;  // disagrees
    EXAMPLE_NCCL_CHECK(env_, ncclCommSplit(world_, tpColor, env_.rank, &tpComm_, nullptr));
    EXAMPLE_NCCL_CHECK(env_, ncclCommSplit(world_, env_.rank % tp_, env_.rank, &dpComm_, nullptr));
    EXAMPLE_NCCL_CHECK(env_, ncclCommUserRank(tpComm_, &tpRank_));
    dpIndex_ = env_.rank / tp_;

    size_t bucket = static_cast<size_t>(options_.bucketKib) * 256;  // floats per KiB: 256
    params_ = allocate(bucket);
    activations_ = allocate(1024);
    for (size_t b = 0; b < 3; ++b) buckets_.push_back(allocate(bucket >> b));  // distinct sizes
    shard_ = allocate(256);
    gathered_ = allocate(256 * dp_);
    scatterIn_ = allocate(256 * dp_);
    pipeOut_ = allocate(512);
    pipeIn_ = allocate(512);
    learningRate_ = allocate(1);
    barrier_ = allocate(1);

    // Parameters: rank 0's values reach everyone.
    for (size_t i = 0; i < params_.count(); ++i) params_.host[i] = env_.rank == 0 ? i % 97 : -1;
    upload(params_);
    EXAMPLE_NCCL_CHECK(env_, ncclBroadcast(params_.device, params_.device, params_.count(),
                                           ncclFloat, 0, world_, stream_));
    download(params_);
    EXAMPLE_CUDA_CHECK(env_, cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < params_.count(); ++i) {
      if (params_.host[i] != static_cast<float>(i % 97)) {
        fail(0, "parameter broadcast", i, params_.host[i], i % 97);
      }
    }
  }

  // Integer-valued inputs so that every sum is exact in float.
  static float value(int rank, int step, size_t index, int salt) {
    return static_cast<float>((rank + 1) * 3 + step * 5 + static_cast<int>(index % 11) + salt);
  }

  bool fail(int step, const char* what, size_t index, float got, float want) {
    std::fprintf(stderr, "train_loop: rank %d step %d: %s wrong at [%zu]: got %g, expected %g\n",
                 env_.rank, step, what, index, got, want);
    return false;
  }

  // Not inlined: a training step is a frame of its own in real programs, and stack dumps of a
  // hang should show it here too.
  __attribute__((noinline)) bool runStep(int step) {
    if (options_.stepMs > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.stepMs));
    }
    if (const Bug* pause = bugAt(BugKind::kPause, step)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(pause->ms));
    }
    if (bugAt(BugKind::kExit, step)) {
      std::printf("train_loop: rank %d leaves early at step %d (injected bug)\n", env_.rank, step);
      std::fflush(stdout);
      std::_Exit(0);
    }
    if (bugAt(BugKind::kCrash, step)) {
      std::fprintf(stderr, "train_loop: rank %d crashes at step %d (injected bug)\n", env_.rank,
                   step);
      std::fflush(stderr);
      raise(SIGSEGV);
    }
    fillInputs(step);
    bool reordered = bugAt(BugKind::kOrder, step) != nullptr;
    if (reordered) issueBarrier(step);  // the world before the TP comm: opposite order
    pace(step);
    EXAMPLE_NCCL_CHECK(env_,
                       ncclAllReduce(activations_.device, activations_.device, activations_.count(),
                                     ncclFloat, ncclSum, tpComm_, stream_));
    issueBuckets(step);
    pace(step);
    EXAMPLE_NCCL_CHECK(env_, ncclAllGather(shard_.device, gathered_.device, shard_.count(),
                                           ncclFloat, dpComm_, stream_));
    pace(step);
    EXAMPLE_NCCL_CHECK(env_, ncclReduceScatter(scatterIn_.device, shard_.device, shard_.count(),
                                               ncclFloat, ncclSum, dpComm_, stream_));
    issuePipeline(step);
    pace(step);
    int root = bugAt(BugKind::kRoot, step) && env_.world > 1 ? 1 : 0;  // a wrong root
    EXAMPLE_NCCL_CHECK(env_, ncclBroadcast(learningRate_.device, learningRate_.device, 1, ncclFloat,
                                           root, world_, stream_));
    if (!reordered) issueBarrier(step);
    for (Buffer* buffer : {&activations_, &buckets_[0], &buckets_[1], &buckets_[2], &gathered_,
                           &shard_, &pipeIn_, &learningRate_, &barrier_}) {
      download(*buffer);
    }
    EXAMPLE_CUDA_CHECK(env_, cudaStreamSynchronize(stream_));
    return checkStep(step);
  }

  void fillInputs(int step) {
    for (size_t i = 0; i < activations_.count(); ++i)
      activations_.host[i] = value(env_.rank, step, i, 1);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (size_t i = 0; i < buckets_[b].count(); ++i) {
        buckets_[b].host[i] = value(env_.rank, step, i, 10 * static_cast<int>(b));
      }
      upload(buckets_[b]);
    }
    for (size_t i = 0; i < shard_.count(); ++i) shard_.host[i] = value(env_.rank, step, i, 7);
    for (size_t i = 0; i < scatterIn_.count(); ++i)
      scatterIn_.host[i] = value(env_.rank, step, i, 2);
    for (size_t i = 0; i < pipeOut_.count(); ++i)
      pipeOut_.host[i] = env_.rank * 1000.0f + step + i % 3;
    learningRate_.host[0] = env_.rank == 0 ? 0.5f * (step + 1) : -1.0f;
    barrier_.host[0] = 1.0f;
    for (Buffer* buffer :
         {&activations_, &shard_, &scatterIn_, &pipeOut_, &learningRate_, &barrier_}) {
      upload(*buffer);
    }
  }

  void issueBuckets(int step) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Buffer& bucket = buckets_[b];
      pace(step);
      if (b == 0 && bugAt(BugKind::kSkip, step)) continue;  // rank-dependent control flow
      size_t count = bucket.count();
      ncclDataType_t dtype = ncclFloat;
      if (b == 0 && bugAt(BugKind::kCount, step)) count -= 1;
      if (b == 0 && bugAt(BugKind::kDtype, step)) dtype = ncclHalf;  // half the bytes
      if (b == 0 && bugAt(BugKind::kOp, step)) {
        EXAMPLE_NCCL_CHECK(
            env_, ncclBroadcast(bucket.device, bucket.device, count, dtype, 0, dpComm_, stream_));
      } else {
        EXAMPLE_NCCL_CHECK(env_, ncclAllReduce(bucket.device, bucket.device, count, dtype, ncclSum,
                                               dpComm_, stream_));
      }
      if (b == 0 && bugAt(BugKind::kExtra, step)) {
        Buffer& last = buckets_.back();
        EXAMPLE_NCCL_CHECK(env_, ncclAllReduce(last.device, last.device, last.count(), ncclFloat,
                                               ncclSum, dpComm_, stream_));
      }
    }
  }

  // Pipeline peers come from the layout and this rank's TP rank, as in Megatron-style code: a
  // rank whose TP group is wrong (the color bug) computes peers that no longer match.
  int nextStage() const { return (((dpIndex_ + 1) % dp_) * tp_ + tpRank_) % env_.world; }
  int previousStage() const { return (((dpIndex_ + dp_ - 1) % dp_) * tp_ + tpRank_) % env_.world; }

  void issuePipeline(int step) {
    int sendTo = nextStage();
    if (bugAt(BugKind::kPeer, step)) sendTo = (sendTo + tp_) % env_.world;  // wrong peer
    pace(step);
    EXAMPLE_NCCL_CHECK(env_, ncclGroupStart());
    EXAMPLE_NCCL_CHECK(
        env_, ncclSend(pipeOut_.device, pipeOut_.count(), ncclFloat, sendTo, world_, stream_));
    EXAMPLE_NCCL_CHECK(env_, ncclRecv(pipeIn_.device, pipeIn_.count(), ncclFloat, previousStage(),
                                      world_, stream_));
    EXAMPLE_NCCL_CHECK(env_, ncclGroupEnd());
  }

  void issueBarrier(int step) {
    pace(step);
    EXAMPLE_NCCL_CHECK(env_, ncclAllReduce(barrier_.device, barrier_.device, 1, ncclFloat, ncclSum,
                                           world_, stream_));
  }

  bool checkStep(int step) {
    int tpFirst = dpIndex_ * tp_;
    for (size_t i = 0; i < activations_.count(); ++i) {
      float want = 0;
      for (int r = tpFirst; r < tpFirst + tp_; ++r) want += value(r, step, i, 1);
      if (activations_.host[i] != want)
        return fail(step, "TP allreduce", i, activations_.host[i], want);
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (size_t i = 0; i < buckets_[b].count(); ++i) {
        float want = 0;
        for (int d = 0; d < dp_; ++d)
          want += value(d * tp_ + dpLane(), step, i, 10 * static_cast<int>(b));
        if (buckets_[b].host[i] != want)
          return fail(step, "DP bucket allreduce", i, buckets_[b].host[i], want);
      }
    }
    for (size_t i = 0; i < gathered_.count(); ++i) {
      int from = static_cast<int>(i / shard_.count()) * tp_ + dpLane();
      float want = value(from, step, i % shard_.count(), 7);
      if (gathered_.host[i] != want) return fail(step, "DP allgather", i, gathered_.host[i], want);
    }
    for (size_t i = 0; i < shard_.count(); ++i) {
      float want = 0;
      size_t index = dpIndexInDpComm() * shard_.count() + i;
      for (int d = 0; d < dp_; ++d) want += value(d * tp_ + dpLane(), step, index, 2);
      if (shard_.host[i] != want) return fail(step, "DP reducescatter", i, shard_.host[i], want);
    }
    for (size_t i = 0; i < pipeIn_.count(); ++i) {
      float want = previousStage() * 1000.0f + step + i % 3;
      if (pipeIn_.host[i] != want) return fail(step, "pipeline receive", i, pipeIn_.host[i], want);
    }
    if (learningRate_.host[0] != 0.5f * (step + 1)) {
      return fail(step, "learning-rate broadcast", 0, learningRate_.host[0], 0.5f * (step + 1));
    }
    if (barrier_.host[0] != static_cast<float>(env_.world)) {
      return fail(step, "barrier allreduce", 0, barrier_.host[0], env_.world);
    }
    if ((env_.rank == 0 && !options_.quiet) || options_.verbose) {
      std::printf("step %d ok: act[0]=%g grad[0]=%g gathered[0]=%g shard[0]=%g lr=%g\n", step,
                  activations_.host[0], buckets_[0].host[0], gathered_.host[0], shard_.host[0],
                  learningRate_.host[0]);
      std::fflush(stdout);
    }
    return true;
  }

  // The DP comm orders ranks by key = world rank, so a rank's index there is its DP stage.
  size_t dpIndexInDpComm() const { return static_cast<size_t>(dpIndex_); }
  // DP groups are the ranks with the same position inside their TP block.
  int dpLane() const { return env_.rank % tp_; }

  void tearDown() {
    EXAMPLE_CUDA_CHECK(env_, cudaStreamSynchronize(stream_));
    EXAMPLE_NCCL_CHECK(env_, ncclCommDestroy(dpComm_));
    EXAMPLE_NCCL_CHECK(env_, ncclCommDestroy(tpComm_));
    EXAMPLE_NCCL_CHECK(env_, ncclCommDestroy(world_));
    EXAMPLE_CUDA_CHECK(env_, cudaStreamDestroy(stream_));
  }

  const LaunchEnv& env_;
  const Options& options_;
  int tp_ = 1, dp_ = 1, tpRank_ = 0, dpIndex_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t world_ = nullptr, tpComm_ = nullptr, dpComm_ = nullptr;
  Buffer params_, activations_, shard_, gathered_, scatterIn_, pipeOut_, pipeIn_, learningRate_,
      barrier_;
  std::vector<Buffer> buckets_;
};

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time through the launcher's pipes
  Options options = parseOptions(argc, argv);
  LaunchEnv env = examples::readLaunchEnv();
  for (const Bug& bug : options.bugs) {
    if (bug.rank >= env.world)
      usageError("--bug rank " + std::to_string(bug.rank) + " is not below the world size");
  }
  TrainLoop loop(env, options);
  return loop.run();
}
