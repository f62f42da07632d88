#ifndef KVD_TESTS_GPU_STREAM_HOLD_H_
#define KVD_TESTS_GPU_STREAM_HOLD_H_

// gpu_bench's way to time a call on the device alone. A call timed between two events on an
// idle stream also counts the host's enqueueing of it: the first event completes at once, and
// the device then waits for the host to submit the kernel. Held, the stream runs a one-thread
// kernel that spins until the host releases it, so the host enqueues the first event, the
// call and the second event behind it; released, the device starts the call as soon as the
// first event is recorded, and the events time the device's start of the kernel and its run
// (NVBench's blocking kernel serves the same purpose). Not part of the backend.

#include <cuda_runtime_api.h>

namespace kvd {

class StreamHold {
 public:
  StreamHold() = default;
  // REQUIRES: no hold of this object pending (released, or timed out, and passed).
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  // Allocates the host-mapped words the hold kernel reads and writes. Call once, first.
  cudaError_t Init();

  // Enqueues the hold on `stream`: a kernel that returns once Release() is called or
  // `timeout_ms` after it starts, whichever is first. REQUIRES: Init() succeeded, and no hold
  // of this object still pending on any stream.
  cudaError_t Hold(cudaStream_t stream, double timeout_ms);

  // Lets the pending hold return.
  void Release();

  // Whether the last hold returned by its timeout rather than by Release(); read it after
  // the stream has passed the hold (work enqueued behind it has completed). A timed-out
  // hold times nothing: the host took that long to enqueue what followed, or never released.
  bool TimedOut() const;

 private:
  volatile int* host_words_ = nullptr;  // [0] released, [1] timed out
  int* device_words_ = nullptr;         // the same words as the device sees them
};

}  // namespace kvd

#endif  // KVD_TESTS_GPU_STREAM_HOLD_H_
