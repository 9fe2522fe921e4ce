// tests/runtime/chat_template_test.cc
//
// Chat formats: which family a template text or name selects, the exact text of one
// turn in each family (llama.cpp's built-in formats), and that the qwen3 vocabulary of
// the reference models turns a chatml turn into its special tokens.
#include "runtime/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/gguf.h"
#include "runtime/tokenizer.h"
#include "tests/runtime/reference_util.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;

const std::string kQwenModel = std::string(TIERKV_SHARED_DIR) + "/reference/models/ref-qwen3moe-q8_0.gguf";

TEST(ChatTemplateTest, NamesAndMarkersSelectTheFamily) {
  auto expect = [](std::string_view t, ChatFamily family, bool sys = true, bool strip = false) {
    auto f = DetectChatFormat(t);
    ASSERT_TRUE(f.ok()) << t << ": " << f.status().ToString();
    EXPECT_EQ(f->family, family) << t;
    if (family == ChatFamily::kLlama2) {
      EXPECT_EQ(f->llama2_system, sys) << t;
      EXPECT_EQ(f->llama2_strip, strip) << t;
    }
  };
  expect("chatml", ChatFamily::kChatml);
  expect("llama3", ChatFamily::kLlama3);
  expect("llama2", ChatFamily::kLlama2, false);
  expect("llama2-sys", ChatFamily::kLlama2, true);
  expect("llama2-sys-strip", ChatFamily::kLlama2, true, true);
  expect("llama2-sys-bos", ChatFamily::kLlama2, true, false);
  expect("{{ '[INST] ' + content.strip() + ' [/INST]' }}", ChatFamily::kLlama2, true, true);
  expect("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}",
         ChatFamily::kChatml);
  expect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", ChatFamily::kLlama3);
  expect("{{ bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + content.strip() + ' [/INST]' }}",
         ChatFamily::kLlama2, true, true);
  expect("{{ '[INST] ' + message['content'] + ' [/INST]' }}", ChatFamily::kLlama2, false, false);

  EXPECT_EQ(DetectChatFormat("").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(DetectChatFormat("{{ '<start_of_turn>user' }}").status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(DetectChatFormat("{{ '[SYSTEM_PROMPT]' }}{{ '[INST]' }}").status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(DetectChatFormat("{{ '<|im_start|>' }}{{ '<|im_sep|>' }}").status().code(), StatusCode::kUnsupported);
  const auto unknown = DetectChatFormat("alpaca");
  EXPECT_NE(unknown.status().message().find("chatml, llama3, llama2"), std::string::npos) << unknown.status().message();
}

TEST(ChatTemplateTest, OneTurnInEachFamily) {
  ChatFormat chatml;
  EXPECT_EQ(FormatChatTurn(chatml, "", "Hi"), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(FormatChatTurn(chatml, "Be brief.", " Hi "),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n");

  ChatFormat llama3{ChatFamily::kLlama3};
  EXPECT_EQ(FormatChatTurn(llama3, " Be brief.\n", " Hi "),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  ChatFormat llama2{ChatFamily::kLlama2, /*llama2_system=*/true, /*llama2_strip=*/false};
  EXPECT_EQ(FormatChatTurn(llama2, "Be brief.", "Hi"), "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]");
  EXPECT_EQ(FormatChatTurn(llama2, "", "Hi"), "[INST] Hi [/INST]");
  llama2.llama2_system = false;
  EXPECT_EQ(FormatChatTurn(llama2, "Be brief.", "Hi"), "[INST] Be brief.\nHi [/INST]");
  llama2.llama2_system = true;
  llama2.llama2_strip = true;
  EXPECT_EQ(FormatChatTurn(llama2, " Be brief. ", " Hi "), "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]");
}

TEST(ChatTemplateTest, ContinuationClosesTheReplyAndOpensTheNextTurn) {
  auto chatml = FormatChatContinuation(ChatFormat{}, "Next");
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(*chatml, "<|im_end|>\n<|im_start|>user\nNext<|im_end|>\n<|im_start|>assistant\n");
  auto llama3 = FormatChatContinuation(ChatFormat{ChatFamily::kLlama3}, "Next");
  ASSERT_TRUE(llama3.ok());
  EXPECT_EQ(*llama3, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nNext<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(FormatChatContinuation(ChatFormat{ChatFamily::kLlama2}, "Next").status().code(), StatusCode::kUnsupported);
}

// The reference qwen3 vocabulary carries Qwen3's Jinja template: chatml, and a turn
// becomes <|im_start|> ... <|im_end|> special tokens when parsed.
TEST(ChatTemplateTest, QwenTemplateIsChatmlAndItsMarkersAreSpecialTokens) {
  TIERKV_NEED_REFERENCE(kQwenModel);
  auto file = GgufFile::Open(kQwenModel);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tmpl = (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok());
  auto format = DetectChatFormat(*tmpl);
  ASSERT_TRUE(format.ok()) << format.status().ToString();
  EXPECT_EQ(format->family, ChatFamily::kChatml);

  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  const int32_t im_start = *(*tok)->TokenId("<|im_start|>"), im_end = *(*tok)->TokenId("<|im_end|>");
  const std::vector<int32_t> ids = (*tok)->Encode(FormatChatTurn(*format, "", "Hi"), true, /*parse_special=*/true);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 1);
  EXPECT_EQ((*tok)->Decode(ids), FormatChatTurn(*format, "", "Hi"));
  // Unparsed, the same text is ordinary characters: no special token at all.
  const std::vector<int32_t> plain = (*tok)->Encode(FormatChatTurn(*format, "", "Hi"), true, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
}

// A whole conversation: [system, user] is FormatChatTurn's text in every family; each
// assistant message is closed, so the next request starts with the previous prompt and
// reply.
TEST(ChatTemplateTest, FormatChatExtendsTheTurnFormat) {
  for (const char* name : {"chatml", "llama3", "llama2", "llama2-sys", "llama2-sys-strip"}) {
    const ChatFormat f = *DetectChatFormat(name);
    const std::vector<ChatMessage> one = {{"system", "Be brief."}, {"user", "Hi"}};
    EXPECT_EQ(*FormatChat(f, one, true), FormatChatTurn(f, "Be brief.", "Hi")) << name;
    const std::vector<ChatMessage> user_only = {{"user", "Hi"}};
    EXPECT_EQ(*FormatChat(f, user_only, true), FormatChatTurn(f, "", "Hi")) << name;
    std::vector<ChatMessage> three = one;
    three.push_back({"assistant", "Hello."});
    const std::string prompt2 = *FormatChat(f, three, false);
    EXPECT_EQ(prompt2.rfind(FormatChatTurn(f, "Be brief.", "Hi") + "Hello.", 0), 0u)
        << name << ": " << prompt2;
    three.push_back({"user", "More"});
    const std::string next = *FormatChat(f, three, true);
    EXPECT_EQ(next.rfind(prompt2, 0), 0u) << name;
    EXPECT_NE(next.find("More"), std::string::npos) << name;
  }
  EXPECT_EQ(*FormatChat(*DetectChatFormat("chatml"), std::vector<ChatMessage>{{"user", "a"}, {"assistant", "b"}}, false),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n");
  EXPECT_EQ(*FormatChat(*DetectChatFormat("llama2"), std::vector<ChatMessage>{{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, true),
            "[INST] a [/INST]b</s>[INST] c [/INST]");
  EXPECT_FALSE(FormatChat(*DetectChatFormat("chatml"), std::vector<ChatMessage>{{"tool", "x"}}, true).ok());
}

}  // namespace
}  // namespace tierkv
