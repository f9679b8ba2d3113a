// A chat choice's text through its output parser (chatout::ChatOutputParser): streamed, each
// event's text becomes the chunk's content, reasoning_content and tool-call pieces; whole, the
// collected text becomes the message. finish_reason becomes "tool_calls" when the choice
// stopped after valid calls. One parser per choice: nothing is shared between requests.
#pragma once

#include "chatout/chat_output_parser.h"
#include "serve/openai_response.h"
#include "serve/tool_request.h"

namespace moeserve::serve {

// `delta` holds one event's text (ChoiceOutput::append); `last`: the choice's last event.
void parse_stream_delta(chatout::ChatOutputParser& parser, const OutputParsing& parsing, bool last,
                        ChoiceOutput& delta);

// `choice` holds the whole text and the engine's finish_reason.
void parse_whole_choice(chatout::ChatOutputParser& parser, const OutputParsing& parsing, ChoiceOutput& choice);

}  // namespace moeserve::serve
