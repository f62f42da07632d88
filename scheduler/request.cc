#include "scheduler/request.h"

namespace kvd {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContextLimit:
      return "context_limit";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "unknown";
}

}  // namespace kvd
