# Texts for the tokenizer cross-check (fixed seed): the qwen .inp strings, random mixes of
# tricky pieces, invalid UTF-8. Written hex-encoded to $XC/texts.json.
import os, random, json
XC = os.environ['XC']
rng = random.Random(20261203)
pieces = [
 "hello", "Hello", "HELLO", "world", " the", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
 "I'm", "you're", "we've", "they'll", "he'd", "it's", "IT'S", "don't", "'s", "'", "''", "\"", "`",
 "123", "4567", "1234567890", "3.14159", "1,000,000", "0x1F", "v2.0.1", "-42", "1e-5",
 "!", "?", "...", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "@", "#", "$", "%", "^", "&", "*", "_", "=", "+", "|", "~",
 "你好", "世界", "日本語のテキスト", "한국어", "中文标点，。！", "Привет", "мир", "Ελληνικά", "עברית", "العربية", "हिन्दी", "தமிழ்", "ไทย",
 "café", "cafe\u0301", "naïve", "na\u0308ive", "ünïcödé", "Å", "A\u030a", "ﬁ", "Ⅻ", "①", "ß", "ẞ", "İ", "ı",
 "🌍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "1️⃣", "🇺🇸", "😀😃😄",
 "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|fim_prefix|>",
 "```python", "def f(x):", "    return x", "#include <stdio.h>", "int main() {", "}", "a_b_c", "camelCaseWord", "snake_case", "https://example.com/path?q=1&r=2",
 "▁", "Ġ", "\u200b", "\u200d", "\ufeff", "\u0000", "\x7f", "\x01",
]
texts = []
inp = open(os.environ['SHARED'] + '/reference/tokenizer/ggml-vocab-qwen3.gguf.inp', encoding='utf-8').read().split('\n__ggml_vocab_test__\n')
texts += [t for t in inp if t]
for n in range(400):
    k = rng.randint(1, 12)
    s = "".join(rng.choice(pieces) + (" " if rng.random() < 0.4 else "") for _ in range(k))
    if rng.random() < 0.2: s = " " + s
    if rng.random() < 0.1: s = s + " "
    texts.append(s)
hexes = [t.encode('utf-8').hex() for t in texts]
# invalid UTF-8 byte sequences
for n in range(60):
    b = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
    hexes.append((rng.choice(pieces).encode() + b + rng.choice(pieces).encode()).hex())
hexes += [b"\xff".hex(), b"\xc3".hex(), b"abc\xe4\xbd".hex(), b"\xf0\x9f\x8c".hex(), b"\xed\xa0\x80".hex(), b"\xc0\xaf".hex()]
json.dump(hexes, open(XC + '/texts.json', 'w'))
print(len(hexes))
