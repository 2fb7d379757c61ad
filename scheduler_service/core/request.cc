#include "scheduler_service/core/request.h"

namespace llm {

const char* SequenceStatusName(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::kWaiting:
      return "WAITING";
    case SequenceStatus::kRunning:
      return "RUNNING";
    case SequenceStatus::kSwapped:
      return "SWAPPED";
    case SequenceStatus::kFinishedStopped:
      return "FINISHED_STOPPED";
    case SequenceStatus::kFinishedLength:
      return "FINISHED_LENGTH";
    case SequenceStatus::kFinishedAborted:
      return "FINISHED_ABORTED";
  }
  return "?";
}

}  // namespace llm
