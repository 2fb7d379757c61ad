// jinja2's filters over sequences and numbers that chat templates use beyond the basic ones:
// sort, unique, min, max, sum, groupby, batch, slice and round, with jinja2's arguments
// (attribute=, case_sensitive=, reverse=, ...). Errors are CallError.
#ifndef LLM_SCHEDULER_SERVICE_CHAT_JINJA_COLLECTION_FILTERS_H_
#define LLM_SCHEDULER_SERVICE_CHAT_JINJA_COLLECTION_FILTERS_H_

#include <string>

#include "scheduler_service/chat/jinja/value.h"

namespace llm::jinja {

// Applies the filter `name` when it is one of these: *out is its value and the result true;
// false for any other name.
bool ApplyCollectionFilter(const std::string& name, const Value& in, CallArgs& args, Value* out);

}  // namespace llm::jinja

#endif  // LLM_SCHEDULER_SERVICE_CHAT_JINJA_COLLECTION_FILTERS_H_
