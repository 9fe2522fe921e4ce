// runtime/chat_template.cc
#include "runtime/chat_template.h"

namespace tierkv {
namespace {

bool Has(std::string_view text, std::string_view marker) { return text.find(marker) != std::string_view::npos; }

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

constexpr std::string_view kSupported = "chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip";

}  // namespace

const char* ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatml: return "chatml";
    case ChatFamily::kLlama3: return "llama3";
    case ChatFamily::kLlama2: return "llama2";
  }
  return "?";
}

Result<ChatFormat> DetectChatFormat(std::string_view t) {
  if (t.empty()) return Status::NotFound("the model has no chat template (tokenizer.chat_template)");
  ChatFormat f;
  // Names first (--chat-template NAME), then the markers of a Jinja template.
  if (t == "chatml") return f;
  if (t == "llama3") {
    f.family = ChatFamily::kLlama3;
    return f;
  }
  // llama2-sys-bos differs from llama2-sys only between turns (a BOS before each [INST]).
  if (t == "llama2" || t == "llama2-sys" || t == "llama2-sys-bos" || t == "llama2-sys-strip") {
    f.family = ChatFamily::kLlama2;
    f.llama2_system = t != "llama2";
    f.llama2_strip = t == "llama2-sys-strip";
    return f;
  }
  if (Has(t, "<|im_start|>")) {
    // chatml; phi-4's <|im_sep|> and SmolVLM's <end_of_utterance> are other formats.
    if (Has(t, "<|im_sep|>") || Has(t, "<end_of_utterance>")) {
      return Status::Unsupported("chat template: a chatml variant (phi-4 / SmolVLM) that tierkv does not format; supported: " +
                                 std::string(kSupported));
    }
    return f;
  }
  if (Has(t, "<|start_header_id|>") && Has(t, "<|end_header_id|>")) {
    f.family = ChatFamily::kLlama3;
    return f;
  }
  if (Has(t, "[INST]")) {
    // Mistral's own templates (system prompt markers, tools, "' [INST] ' + system_message")
    // space their markers differently.
    if (Has(t, "[SYSTEM_PROMPT]") || Has(t, "[AVAILABLE_TOOLS]") || Has(t, "' [INST] ' + system_message")) {
      return Status::Unsupported("chat template: a Mistral [INST] format that tierkv does not format; supported: " +
                                 std::string(kSupported) + " (--chat-template NAME)");
    }
    f.family = ChatFamily::kLlama2;
    // As llama.cpp: a template that strips (content.strip()) is its llama2-sys-strip,
    // with <<SYS>> markers whether it spells them or not.
    f.llama2_strip = Has(t, "content.strip()");
    f.llama2_system = Has(t, "<<SYS>>") || f.llama2_strip;
    return f;
  }
  return Status::Unsupported("chat template: not one of the formats tierkv knows (" + std::string(kSupported) +
                             "); give --chat-template NAME, or a raw --prompt");
}

std::string FormatChatTurn(const ChatFormat& format, std::string_view system, std::string_view user) {
  std::string s;
  switch (format.family) {
    case ChatFamily::kChatml:
      if (!system.empty()) s.append("<|im_start|>system\n").append(system).append("<|im_end|>\n");
      s.append("<|im_start|>user\n").append(user).append("<|im_end|>\n");
      s.append("<|im_start|>assistant\n");
      break;
    case ChatFamily::kLlama3:
      if (!system.empty()) s.append("<|start_header_id|>system<|end_header_id|>\n\n").append(Trim(system)).append("<|eot_id|>");
      s.append("<|start_header_id|>user<|end_header_id|>\n\n").append(Trim(user)).append("<|eot_id|>");
      s.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case ChatFamily::kLlama2: {
      const std::string_view sys = format.llama2_strip ? Trim(system) : system;
      const std::string_view usr = format.llama2_strip ? Trim(user) : user;
      s.append("[INST] ");
      if (!system.empty()) {
        if (format.llama2_system) {
          s.append("<<SYS>>\n").append(sys).append("\n<</SYS>>\n\n");
        } else {
          s.append(sys).append("\n");
        }
      }
      s.append(usr).append(" [/INST]");
      break;
    }
  }
  return s;
}

Result<ChatFormat> ModelChatFormat(const GgufFile& file) {
  if (!file.Has("tokenizer.chat_template")) return DetectChatFormat("");
  TIERKV_ASSIGN_OR_RETURN(const std::string_view t, file.GetString("tokenizer.chat_template"));
  return DetectChatFormat(t);
}

Result<std::string> FormatChatContinuation(const ChatFormat& format, std::string_view user) {
  switch (format.family) {
    case ChatFamily::kChatml: return "<|im_end|>\n" + FormatChatTurn(format, "", user);
    case ChatFamily::kLlama3: return "<|eot_id|>" + FormatChatTurn(format, "", user);
    case ChatFamily::kLlama2: break;
  }
  return Status::Unsupported("continuing a conversation is supported for the chatml and llama3 chat formats, not " +
                             std::string(ChatFamilyName(format.family)));
}

Result<std::string> FormatChat(const ChatFormat& format, std::span<const ChatMessage> messages, bool add_assistant) {
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return Status::InvalidArgument("chat message role '" + m.role + "': tierkv formats system, user and assistant");
    }
  }
  std::string s;
  switch (format.family) {
    case ChatFamily::kChatml:
      for (const ChatMessage& m : messages) s.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
      if (add_assistant) s.append("<|im_start|>assistant\n");
      return s;
    case ChatFamily::kLlama3:
      for (const ChatMessage& m : messages) {
        s.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n").append(Trim(m.content)).append("<|eot_id|>");
      }
      if (add_assistant) s.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
      return s;
    case ChatFamily::kLlama2: {
      // [INST] (<<SYS>> system <</SYS>>) user [/INST] assistant</s>[INST] user [/INST] ...
      std::string system;
      bool in_turn = false;
      for (const ChatMessage& m : messages) {
        const std::string_view text = format.llama2_strip ? Trim(m.content) : std::string_view(m.content);
        if (m.role == "system") {
          system.append(system.empty() ? "" : "\n").append(text);
        } else if (m.role == "user") {
          if (!in_turn) s.append("[INST] ");
          if (!system.empty()) {
            if (format.llama2_system) {
              s.append("<<SYS>>\n").append(system).append("\n<</SYS>>\n\n");
            } else {
              s.append(system).append("\n");
            }
            system.clear();
          }
          s.append(text).append(" [/INST]");
          in_turn = true;
        } else {
          s.append(text).append("</s>");
          in_turn = false;
        }
      }
      return s;
    }
  }
  return s;
}

}  // namespace tierkv
