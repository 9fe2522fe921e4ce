// runtime/chat_template.h
//
// One chat turn as the model was trained to see it: `tierkv run --chat` wraps the prompt
// (and an optional --system-prompt) in the model's chat format and adds the assistant's
// opening, the way llama.cpp's built-in templates do (llama.cpp does not run the Jinja
// in tokenizer.chat_template either: it recognises the family by marker strings and
// formats in code). Families:
//
//   chatml  (Qwen 1.5 – 3, many fine-tunes)   <|im_start|>ROLE\nTEXT<|im_end|>\n ... <|im_start|>assistant\n
//   llama3  (Llama 3.x)                        <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> ... assistant header
//   llama2  (Llama 2 chat, Mistral v0.1-style) [INST] <<SYS>>\nSYS\n<</SYS>>\n\nUSER [/INST]
//           (variants by marker: "content.strip()" strips the texts; without it and
//           without <<SYS>>, the system text is a plain first line)
//
// Thread-safety: pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "memory/status.h"
#include "runtime/gguf.h"

namespace tierkv {

enum class ChatFamily { kChatml, kLlama3, kLlama2 };

struct ChatFormat {
  ChatFamily family = ChatFamily::kChatml;
  bool llama2_system = true;  // llama2: the system text inside <<SYS>> markers
  bool llama2_strip = false;  // llama2: texts stripped of surrounding whitespace
};

// The format of a model file's tokenizer.chat_template (kNotFound when it has none).
Result<ChatFormat> ModelChatFormat(const GgufFile& file);

// "chatml", "llama3", "llama2".
const char* ChatFamilyName(ChatFamily family);

// The format of a tokenizer.chat_template text, or of a name given with --chat-template
// (chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip). kUnsupported naming the
// supported families when neither matches; kNotFound when text is empty.
Result<ChatFormat> DetectChatFormat(std::string_view template_or_name);

// The prompt text of one turn: the system message (when not empty), the user message,
// and the opening of the assistant's reply. Its special tokens are meant to be parsed
// (Tokenizer::Encode with parse_special = true), as llama.cpp does in chat mode.
std::string FormatChatTurn(const ChatFormat& format, std::string_view system, std::string_view user);

// The text that closes the assistant's reply a conversation ends with (its end-of-turn
// marker, which generation samples but never feeds back) and adds the next user turn
// and the assistant's opening: what `tierkv run --chat --continue` appends to a saved
// conversation. chatml and llama3; kUnsupported for llama2, whose turns are delimited
// by BOS/EOS in ways its variants differ on.
Result<std::string> FormatChatContinuation(const ChatFormat& format, std::string_view user);

// One message of a conversation (an OpenAI chat request's): role "system", "user" or
// "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

// The prompt text of a whole conversation in the model's format, and with
// add_assistant the opening of the next assistant reply: for [system, user] (or [user])
// the text FormatChatTurn gives. An assistant message is closed by its end-of-turn
// marker (chatml <|im_end|>, llama3 <|eot_id|>, llama2 </s>), so that a conversation's
// next request begins with the tokens of the previous one and its reply (the reply's
// end-of-generation token, sampled but not fed, is the first new token). A system
// message after the first message is a turn of its own (chatml, llama3) or dropped
// into the next [INST] (llama2). kInvalidArgument for another role.
Result<std::string> FormatChat(const ChatFormat& format, std::span<const ChatMessage> messages, bool add_assistant);

}  // namespace tierkv
