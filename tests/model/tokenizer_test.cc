#include "model/tokenizer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_loader.h"
#include "model/streaming_decoder.h"
#include "nlohmann/json.hpp"
#include "tests/model/llama_tokenizer_cases.h"

namespace kvd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const char kTok512Path[] = KVD_SHARED_DIR "/models/tok512.bin";
const char kGoldenPath[] = KVD_SHARED_DIR "/models/golden/stories260K_greedy.jsonl";

std::unique_ptr<Tokenizer> LoadTok512() {
  auto tokenizer = Tokenizer::LoadLlama2c(kTok512Path, 512);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// llama2.c run.c's encoder, transcribed literally (quadratic rescan), as the oracle.
std::vector<int32_t> ReferenceEncode(const Tokenizer& t, std::string_view text, bool add_bos) {
  std::vector<int32_t> tokens;
  if (add_bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(t.PieceToId(" "));
  std::string buffer;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<uint8_t>(text[i]) & 0xC0) != 0x80) buffer.clear();
    buffer += text[i];
    if (i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80 &&
        buffer.size() < 4) {
      continue;
    }
    const int32_t id = t.PieceToId(buffer);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (char c : buffer) tokens.push_back(static_cast<uint8_t>(c) + 3);
    }
    buffer.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1;
    size_t best_index = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const std::string pair =
          std::string(t.piece(tokens[i])) + std::string(t.piece(tokens[i + 1]));
      const int32_t id = t.PieceToId(pair);
      if (id != -1 && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_index = i;
      }
    }
    if (best_id == -1) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + best_index + 1);
  }
  return tokens;
}

bool HasByteToken(const std::vector<int32_t>& tokens) {
  for (int32_t id : tokens) {
    if (id >= 3 && id < 259) return true;
  }
  return false;
}

// --- Encoding and decoding against llama2.c ---------------------------------------------

TEST(TokenizerTest, LoadsTok512) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_id(), 2);
  EXPECT_EQ(tokenizer->max_token_length(), 7);
  EXPECT_EQ(tokenizer->piece(0), "<unk>");
  EXPECT_EQ(tokenizer->piece(3 + 0x41), "<0x41>");
  EXPECT_EQ(tokenizer->PieceToId(" "), 410);
  EXPECT_EQ(tokenizer->PieceToId("no such piece"), -1);
}

TEST(TokenizerTest, GoldenPromptsEncodeAndCompletionsDecodeLikeLlama2c) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  std::ifstream golden(kGoldenPath);
  ASSERT_TRUE(golden) << kGoldenPath;
  int num_cases = 0;
  for (std::string line; std::getline(golden, line);) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line);
    const auto prompt = record.at("prompt").get<std::string>();
    const auto prompt_tokens = record.at("prompt_tokens").get<std::vector<int32_t>>();
    const auto output_tokens = record.at("output_tokens").get<std::vector<int32_t>>();
    const auto completion = record.at("completion_text").get<std::string>();
    SCOPED_TRACE(prompt);
    EXPECT_EQ(tokenizer->Encode(prompt, /*add_bos=*/true), prompt_tokens);
    EXPECT_EQ(tokenizer->Decode(output_tokens, prompt_tokens.back()), completion);

    StreamingDecoder stream(tokenizer.get(), prompt_tokens.back());
    std::string streamed;
    for (int32_t token : output_tokens) streamed += stream.Push(token);
    streamed += stream.Flush();
    EXPECT_EQ(streamed, completion);
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 12);
}

TEST(TokenizerTest, EncodeMatchesRunCOnRandomText) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  // Fragments mixing common pieces, spaces, punctuation, multi-byte characters in and out
  // of the vocabulary, lone continuation bytes and invalid bytes.
  const std::vector<std::string> fragments = {"the",
                                              " ",
                                              "  ",
                                              "Lily",
                                              " and",
                                              "ed",
                                              "ing",
                                              ".",
                                              ",",
                                              "\n",
                                              "a",
                                              "b",
                                              "x",
                                              "\xE2\x84\xA2",
                                              "é",
                                              "ö",
                                              "✓",
                                              "日本",
                                              "\x80",
                                              "\xBF\xBF\xBF\xBF\xBF",
                                              "\xFF",
                                              "\xE6\x97",
                                              "Once upon a time",
                                              "!",
                                              "'s",
                                              "\t",
                                              "0",
                                              "9"};
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int num_fragments = std::uniform_int_distribution<int>(0, 25)(rng);
    for (int i = 0; i < num_fragments; ++i) {
      text += fragments[std::uniform_int_distribution<size_t>(0, fragments.size() - 1)(rng)];
    }
    const bool add_bos = round % 2 == 0;
    ASSERT_EQ(tokenizer->Encode(text, add_bos), ReferenceEncode(*tokenizer, text, add_bos))
        << "text: '" << text << "'";
  }
}

// The validator refuses a text by this bound before encoding it, so it must never exceed
// the real count (that would refuse a prompt that fits).
TEST(TokenizerTest, MinEncodedTokensNeverExceedsTheEncoding) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  std::string longest;
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    if (tokenizer->piece(id).size() > longest.size()) longest = tokenizer->piece(id);
  }
  const std::vector<std::string> fragments = {"the", " ", "Lily", " and", "ing",  ".",
                                              "\n",  "é", "日本", "\x80", "\xFF", longest};
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int num_fragments = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < num_fragments; ++i) {
      text += fragments[std::uniform_int_distribution<size_t>(0, fragments.size() - 1)(rng)];
    }
    for (bool add_bos : {false, true}) {
      const int64_t bound = tokenizer->MinEncodedTokens(static_cast<int64_t>(text.size()), add_bos);
      ASSERT_LE(bound, static_cast<int64_t>(tokenizer->Encode(text, add_bos).size()))
          << "text: '" << text << "'";
    }
  }
  EXPECT_EQ(tokenizer->MinEncodedTokens(0, true), 1);
  EXPECT_EQ(tokenizer->MinEncodedTokens(0, false), 0);
  // Not vacuous: a megabyte needs tens of thousands of tokens.
  EXPECT_GT(tokenizer->MinEncodedTokens(1 << 20, true),
            (1 << 20) / static_cast<int64_t>(longest.size()));
}

TEST(TokenizerTest, EmptyTextIsJustBosOrNothing) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_THAT(tokenizer->Encode("", true), ElementsAre(1));
  EXPECT_THAT(tokenizer->Encode("", false), IsEmpty());
}

TEST(TokenizerTest, NonEmptyTextStartsWithTheDummyPrefixSpace) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  // "~" does not merge with a space in tok512, so the dummy prefix stays a separate token.
  EXPECT_THAT(tokenizer->Encode("~", false), ElementsAre(410, tokenizer->PieceToId("~")));
}

TEST(TokenizerTest, AsciiRoundTrips) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", " leading space", "a",
        "Tabs\tand\nnewlines\n\n", "symbols: {}[]<>#$%^&*~`|\\", "  two spaces"}) {
    const std::vector<int32_t> tokens = tokenizer->Encode(text, true);
    EXPECT_EQ(tokenizer->Decode(absl::MakeSpan(tokens).subspan(1), tokens[0]), text);
  }
}

TEST(TokenizerTest, MultiByteUtf8RoundTripsThroughByteFallback) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "héllo wörld ✓ 日本";
  const std::vector<int32_t> tokens = tokenizer->Encode(text, true);
  EXPECT_TRUE(HasByteToken(tokens)) << "日本 is not in the 512-token vocabulary";
  EXPECT_EQ(tokenizer->Decode(absl::MakeSpan(tokens).subspan(1), 1), text);
  // "日" is E6 97 A5: three byte tokens after the dummy prefix.
  EXPECT_THAT(tokenizer->Encode("日", false), ElementsAre(410, 3 + 0xE6, 3 + 0x97, 3 + 0xA5));
  // A code point that is a piece is one token: "™" is in tok512.
  EXPECT_THAT(tokenizer->Encode("\xE2\x84\xA2", false),
              ElementsAre(410, tokenizer->PieceToId("\xE2\x84\xA2")));
}

TEST(TokenizerTest, EmbeddedNulIsAByteToken) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text("a\0b", 3);
  const std::vector<int32_t> tokens = tokenizer->Encode(text, false);
  EXPECT_THAT(tokens, ::testing::Contains(3));
  EXPECT_EQ(tokenizer->Decode(tokens, 0), " " + text);
}

TEST(TokenizerTest, DecodeTokenFollowsRunC) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  const int32_t space_t = tokenizer->PieceToId(" t");
  ASSERT_GE(space_t, 0);
  EXPECT_EQ(tokenizer->DecodeToken(1, space_t), "t");   // after BOS: leading space dropped
  EXPECT_EQ(tokenizer->DecodeToken(5, space_t), " t");  // elsewhere kept
  EXPECT_EQ(tokenizer->DecodeToken(1, 3 + 'A'), "A");   // byte piece is the raw byte
  EXPECT_EQ(tokenizer->DecodeToken(1, 3 + 0x20), " ");  // ... not stripped after BOS
  EXPECT_EQ(tokenizer->DecodeToken(0, 3 + 0xE6), "\xE6");
  EXPECT_EQ(tokenizer->DecodeToken(0, 1), "\n<s>\n");
}

TEST(TokenizerTest, OutOfVocabularyIdsDecodeToNothing) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->DecodeToken(1, 512), "");
  EXPECT_EQ(tokenizer->DecodeToken(1, -1), "");
  EXPECT_EQ(tokenizer->DecodeToken(1, INT32_MAX), "");
  const std::vector<int32_t> tokens = {3 + 'h', 999, 3 + 'i'};
  EXPECT_EQ(tokenizer->Decode(tokens, 0), "hi");
}

// --- StreamingDecoder ----------------------------------------------------------------------

TEST(StreamingDecoderTest, HoldsASplitCharacterUntilItIsComplete) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  StreamingDecoder stream(tokenizer.get(), /*prev_token=*/5);
  EXPECT_EQ(stream.Push(3 + 'a'), "a");
  EXPECT_EQ(stream.Push(3 + 0xE6), "");
  EXPECT_EQ(stream.num_held_bytes(), 1u);
  EXPECT_EQ(stream.Push(3 + 0x97), "");
  EXPECT_EQ(stream.num_held_bytes(), 2u);
  EXPECT_EQ(stream.Push(3 + 0xA5), "日");
  EXPECT_EQ(stream.num_held_bytes(), 0u);
  EXPECT_EQ(stream.Flush(), "");
}

TEST(StreamingDecoderTest, PushByPushEqualsDecodeForValidUtf8) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "héllo wörld ✓ 日本, Lily said: \"🙂\" and ran.";
  const std::vector<int32_t> tokens = tokenizer->Encode(text, true);
  ASSERT_TRUE(HasByteToken(tokens));
  StreamingDecoder stream(tokenizer.get(), tokens[0]);
  std::string streamed;
  for (size_t i = 1; i < tokens.size(); ++i) {
    streamed += stream.Push(tokens[i]);
  }
  streamed += stream.Flush();
  EXPECT_EQ(streamed, tokenizer->Decode(absl::MakeSpan(tokens).subspan(1), tokens[0]));
  EXPECT_EQ(streamed, text);
}

TEST(StreamingDecoderTest, StripsTheLeadingSpaceAfterABosPrompt) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  const int32_t space_t = tokenizer->PieceToId(" t");
  StreamingDecoder stream(tokenizer.get(), /*prev_token=*/1);
  EXPECT_EQ(stream.Push(space_t), "t");
  EXPECT_EQ(stream.Push(space_t), " t");
}

TEST(StreamingDecoderTest, FlushTurnsAnUnfinishedCharacterIntoReplacementCharacter) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  StreamingDecoder stream(tokenizer.get(), 5);
  EXPECT_EQ(stream.Push(3 + 0xE6), "");
  EXPECT_EQ(stream.Push(3 + 0x97), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.num_held_bytes(), 0u);
  EXPECT_EQ(stream.Push(3 + 'z'), "z");  // usable after Flush
}

TEST(StreamingDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  auto tokenizer = LoadTok512();
  ASSERT_NE(tokenizer, nullptr);
  StreamingDecoder stream(tokenizer.get(), 5);
  EXPECT_EQ(stream.Push(3 + 0xFF), "\xEF\xBF\xBD");  // never valid
  EXPECT_EQ(stream.Push(3 + 0x80), "\xEF\xBF\xBD");  // lone continuation
  EXPECT_EQ(stream.Push(3 + 0xE6), "");
  // A lead byte followed by a non-continuation: the lead is replaced, the next byte kept.
  EXPECT_EQ(stream.Push(3 + 'q'), "\xEF\xBF\xBDq");
  // Overlong encoding of '/' (C0 AF) is two invalid bytes.
  EXPECT_EQ(stream.Push(3 + 0xC0), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Push(3 + 0xAF), "\xEF\xBF\xBD");
  // A surrogate (ED A0 80) is rejected at its second byte: ED, then A0 and 80 alone.
  EXPECT_EQ(stream.Push(3 + 0xED), "");
  EXPECT_EQ(stream.Push(3 + 0xA0), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(stream.Push(3 + 0x80), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Flush(), "");
}

// --- Merge rules on a hand-made vocabulary --------------------------------------------------

struct Entry {
  float score;
  std::string piece;
};

std::string Serialize(int32_t max_token_length, const std::vector<Entry>& entries) {
  std::string bytes;
  auto put = [&bytes](const void* p) { bytes.append(static_cast<const char*>(p), 4); };
  put(&max_token_length);
  for (const Entry& e : entries) {
    const int32_t length = static_cast<int32_t>(e.piece.size());
    put(&e.score);
    put(&length);
    bytes += e.piece;
  }
  return bytes;
}

std::vector<Entry> BaseEntries() {
  std::vector<Entry> entries = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}};
  char piece[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    entries.push_back({0, piece});
  }
  return entries;
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/kvd_tokenizer_test_" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::unique_ptr<Tokenizer> LoadEntries(const std::string& name, std::vector<Entry> extra) {
  std::vector<Entry> entries = BaseEntries();
  entries.insert(entries.end(), extra.begin(), extra.end());
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp(name, Serialize(6, entries)));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// A tokenizer file `name` of `count` entries, all but the base ones empty pieces (8 bytes
// each). (Tests run in parallel processes: each its own file.)
std::string ManyEmptyPieces(const std::string& name, int32_t count) {
  std::vector<Entry> entries = BaseEntries();
  entries.resize(count, Entry{0, ""});
  return WriteTemp(name, Serialize(6, entries));
}

TEST(TokenizerMergeTest, EqualScoresMergeTheLeftmostPair) {
  // ids: " "=259, a=260, b=261, ab=262, ba=263
  auto t = LoadEntries("ties", {{0, " "}, {0, "a"}, {0, "b"}, {-1, "ab"}, {-1, "ba"}});
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("aba", false), ElementsAre(259, 262, 260));
}

TEST(TokenizerMergeTest, HigherScoreMergesFirst) {
  auto t = LoadEntries("scores", {{0, " "}, {0, "a"}, {0, "b"}, {-2, "ab"}, {-1, "ba"}});
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("aba", false), ElementsAre(259, 260, 263));
}

TEST(TokenizerMergeTest, MergesChainAndIncludeTheDummyPrefix) {
  // " a" then " ab" then " abb": each merge creates the next candidate pair.
  auto t = LoadEntries(
      "chain", {{0, " "}, {0, "a"}, {0, "b"}, {-1, " a"}, {-2, " ab"}, {-3, " abb"}, {-9, "bb"}});
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("abb", false), ElementsAre(264));
  EXPECT_EQ(t->Encode("abb", false), ReferenceEncode(*t, "abb", false));
}

TEST(TokenizerMergeTest, ScoresAtOrBelowMinusTenBillionNeverMerge) {
  auto t = LoadEntries("floor", {{0, " "}, {0, "a"}, {0, "b"}, {-1e10f, "ab"}});
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("ab", false), ElementsAre(259, 260, 261));
}

TEST(TokenizerMergeTest, MissingSpacePieceFallsBackToItsByte) {
  auto t = LoadEntries("nospace", {{0, "a"}});
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("a", false), ElementsAre(3 + ' ', 259));
}

// --- Loader errors ---------------------------------------------------------------------

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// llama.cpp's tokenizer test cases (llama_tokenizer_cases.h) on the LLaMA vocabulary read
// from its GGUF file as kvd reads a GGUF model's (LoadGgufTokenizer).
TEST(TokenizerTest, LlamaVocabularyMatchesLlamaCppsTestCases) {
  auto tokenizer = LoadGgufTokenizer(test::kLlamaSpmVocab, 32000);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  test::ExpectEncodesLlamaTokenizerCases(**tokenizer);
}

TEST(TokenizerLoadTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "/kvd_tokenizer_test_does_not_exist.bin";
  auto tokenizer = Tokenizer::LoadLlama2c(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(path));
}

TEST(TokenizerLoadTest, EmptyFileIsRejected) {
  const std::string path = WriteTemp("empty", "");
  auto tokenizer = Tokenizer::LoadLlama2c(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(path));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("offset 0"));
}

TEST(TokenizerLoadTest, TruncatedFileNamesTheOffset) {
  const std::string full = ReadFile(kTok512Path);
  ASSERT_GT(full.size(), 100u);
  // Cut inside the first piece ("<unk>" starts at offset 12), inside an entry header, and
  // one byte short of the end.
  for (size_t size : {size_t{14}, size_t{6}, full.size() - 1}) {
    SCOPED_TRACE(size);
    const std::string path = WriteTemp("truncated", full.substr(0, size));
    auto tokenizer = Tokenizer::LoadLlama2c(path);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(path));
    EXPECT_THAT(tokenizer.status().message(), HasSubstr("truncated"));
    EXPECT_THAT(tokenizer.status().message(), HasSubstr("offset"));
  }
  auto exact = Tokenizer::LoadLlama2c(WriteTemp("truncated_header", full.substr(0, 6)));
  ASSERT_FALSE(exact.ok());
  EXPECT_THAT(exact.status().message(), HasSubstr("at offset 4"));
}

TEST(TokenizerLoadTest, NegativePieceLengthIsRejected) {
  std::string bytes = Serialize(6, BaseEntries());
  const float score = 0;
  const int32_t length = -3;
  bytes.append(reinterpret_cast<const char*>(&score), 4);
  bytes.append(reinterpret_cast<const char*>(&length), 4);
  bytes += "abc";
  const size_t length_offset = bytes.size() - 7;
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("negative", bytes));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("length -3"));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("token 259"));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("offset " + std::to_string(length_offset)));
}

TEST(TokenizerLoadTest, PieceLongerThanMaxTokenLengthIsRejected) {
  std::vector<Entry> entries = BaseEntries();
  entries.push_back({0, "toolongpiece"});
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("long", Serialize(6, entries)));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("max_token_length"));
}

TEST(TokenizerLoadTest, NonPositiveMaxTokenLengthIsRejected) {
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("maxlen", Serialize(0, BaseEntries())));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("max_token_length 0"));
}

TEST(TokenizerLoadTest, WhatIsNotARegularFileIsRefusedNamingIt) {
  // A directory (read as a stream it throws), and a device that would be read forever.
  for (const std::string& path : {::testing::TempDir(), std::string("/dev/zero")}) {
    auto tokenizer = Tokenizer::LoadLlama2c(path);
    ASSERT_FALSE(tokenizer.ok()) << path;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(),
                AllOf(HasSubstr(path), HasSubstr("not a regular file")));
  }
}

TEST(TokenizerLoadTest, APathThatCannotBeExaminedIsAnErrorNotACrash) {
  // tok512.bin beside the model is a symbolic link to itself.
  const std::string dir = ::testing::TempDir() + "/kvd_tokenizer_test_loop";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("tok512.bin", dir + "/tok512.bin");
  auto direct = Tokenizer::LoadLlama2c(dir + "/tok512.bin");
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(direct.status().message(), HasSubstr("symbolic links"));
  auto beside = Tokenizer::FindBesideModel(dir + "/model.bin", 512);
  ASSERT_FALSE(beside.ok());
  EXPECT_EQ(beside.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(beside.status().message(), HasSubstr("symbolic links"));
  std::filesystem::remove_all(dir);
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVD_HAS_ASAN_FEATURE 1
#endif
#endif
#ifndef KVD_HAS_ASAN_FEATURE
#define KVD_HAS_ASAN_FEATURE 0
#endif

// AddressSanitizer maps terabytes of shadow memory: an address-space limit cannot apply.
#if !defined(__SANITIZE_ADDRESS__) && !KVD_HAS_ASAN_FEATURE
// The process's mapped address space now (/proc/self/statm's first field, in pages).
size_t CurrentAddressSpaceBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Expects `check` to return true in a child process that may map only `extra_bytes` more
// address space than it has now.
void ExpectWithinAddressSpace(size_t extra_bytes, const std::function<bool()>& check) {
  EXPECT_EXIT(
      {
        rlimit limit;
        getrlimit(RLIMIT_AS, &limit);
        rlimit lowered = limit;
        lowered.rlim_cur = CurrentAddressSpaceBytes() + extra_bytes;
        setrlimit(RLIMIT_AS, &lowered);
        std::exit(check() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(TokenizerLoadTest, AnOverstatedMaxTokenLengthCostsNoMemory) {
  // The header's max_token_length is only an upper bound of the pieces: 2^31 - 1 here, with
  // pieces of at most 6 bytes. Encoding sizes its buffers from the pieces, so it runs in a
  // process that may not map 1 GiB more (it reserved 4 GiB a call before).
  const std::string path = WriteTemp("overstated", Serialize(0x7fffffff, BaseEntries()));
  auto tokenizer = Tokenizer::LoadLlama2c(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ExpectWithinAddressSpace(
      size_t{1} << 30, [&] { return (*tokenizer)->Encode("Once upon a time", true).size() > 1; });
}

// Refusing the file of two million pieces below costs about the file (16 MB), not 64 bytes
// a piece.
TEST(TokenizerLoadTest, RefusingAnOversizedVocabularyCostsLittleMoreThanTheFile) {
  const std::string path = ManyEmptyPieces("many_empty_memory", 2'000'000);  // 16 MB
  ExpectWithinAddressSpace(size_t{48} << 20, [&] {
    return Tokenizer::LoadLlama2c(path, 512).status().code() == absl::StatusCode::kInvalidArgument;
  });
  std::filesystem::remove(path);
}
#endif

TEST(TokenizerLoadTest, NanScoreIsRejected) {
  std::vector<Entry> entries = BaseEntries();
  entries.push_back({std::nanf(""), "x"});
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("nan", Serialize(6, entries)));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("NaN"));
}

TEST(TokenizerLoadTest, VocabularyWithoutBytePiecesIsRejected) {
  std::vector<Entry> entries = BaseEntries();
  entries[3 + 0x41].piece = "A";
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("nobytes", Serialize(6, entries)));
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("<0x41>"));

  entries.resize(100);
  auto small = Tokenizer::LoadLlama2c(WriteTemp("small", Serialize(6, entries)));
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.status().message(), HasSubstr("only 100 tokens"));
}

// A file of more entries than the model's vocabulary is refused with its count, and entries
// past the vocabulary are not kept: a 16 MB file of two million empty pieces once took 64
// bytes a piece (and 1.4 GB at the 256 MB file limit) before its count was compared.
TEST(TokenizerLoadTest, AVocabularyPastTheExpectedSizeIsRefusedWithItsCount) {
  const std::string path = ManyEmptyPieces("many_empty_message", 2'000'000);
  auto tokenizer = Tokenizer::LoadLlama2c(path, 512);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(),
              AllOf(HasSubstr(path), HasSubstr("has 2000000 tokens but the model expects 512")));
  EXPECT_TRUE(Tokenizer::LoadLlama2c(path).ok());  // no expected size: all of them
  std::filesystem::remove(path);
}

// Stray bytes after a whole vocabulary are a truncated entry, not extra tokens.
TEST(TokenizerLoadTest, TrailingBytesAfterTheVocabularyAreATruncatedEntry) {
  std::string bytes = ReadFile(kTok512Path);
  bytes += "\n";
  auto tokenizer = Tokenizer::LoadLlama2c(WriteTemp("trailing_byte", bytes), 512);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(
      tokenizer.status().message(),
      HasSubstr("truncated entry for token 512: need 8 bytes for score and length, 1 left"));
}

TEST(TokenizerLoadTest, ExpectedVocabSizeMustMatch) {
  auto tokenizer = Tokenizer::LoadLlama2c(kTok512Path, 32000);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("512"));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("32000"));
  EXPECT_TRUE(Tokenizer::LoadLlama2c(kTok512Path).ok());
}

TEST(TokenizerTest, FindsTheTokenizerBesideAModelByVocabulary) {
  const std::string model = KVD_SHARED_DIR "/models/stories260K.bin";
  auto found = Tokenizer::FindBesideModel(model, 512);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->vocab_size(), 512);
  // tok512.bin is there but has the wrong vocabulary: the error says so.
  auto wrong = Tokenizer::FindBesideModel(model, 32000);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::HasSubstr("tok512.bin: "));
  auto none = Tokenizer::FindBesideModel(::testing::TempDir() + "/nowhere/model.bin", 512);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("tried tok512.bin"));
}

}  // namespace
}  // namespace kvd
