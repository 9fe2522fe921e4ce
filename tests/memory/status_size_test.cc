// tests/memory/status_size_test.cc
//
// Status / Result (memory/status.h), ParseSize / FormatBytes (memory/size.h) and the
// tier names (memory/types.h).
#include <cerrno>
#include <concepts>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "memory/size.h"
#include "memory/status.h"
#include "memory/types.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

// 'text', as error messages quote user input. (Built with += rather than "'" + s + "'",
// which trips a GCC 12 -Wrestrict false positive at -O3.)
std::string Quoted(const char* text) {
  std::string q = "'";
  q += text;
  q += '\'';
  return q;
}

// ---------------------------------------------------------------------------------
// Status

TEST(StatusTest, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "invalid argument"},
      {Status::Exhausted("m"), StatusCode::kExhausted, "exhausted"},
      {Status::IoError("m"), StatusCode::kIoError, "io error"},
      {Status::NoSpace("m"), StatusCode::kNoSpace, "no space"},
      {Status::NotFound("m"), StatusCode::kNotFound, "not found"},
      {Status::Corruption("m"), StatusCode::kCorruption, "corruption"},
      {Status::Unsupported("m"), StatusCode::kUnsupported, "unsupported"},
      {Status::PermissionDenied("m"), StatusCode::kPermissionDenied, "permission denied"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "failed precondition"},
      {Status::Internal("m"), StatusCode::kInternal, "internal"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_STREQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "ok");
}

TEST(StatusTest, FromErrnoMapsCodesAndQuotesStrerror) {
  struct Case {
    int err;
    StatusCode code;
  };
  const Case cases[] = {
      {ENOSPC, StatusCode::kNoSpace},         {EDQUOT, StatusCode::kNoSpace},
      {EIO, StatusCode::kIoError},            {EBADF, StatusCode::kIoError},
      {ENOMEM, StatusCode::kExhausted},       {EPERM, StatusCode::kPermissionDenied},
      {EACCES, StatusCode::kPermissionDenied}, {ENOENT, StatusCode::kNotFound},
      {EINVAL, StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.err);
    const Status s = Status::FromErrno(c.err, "pwrite disk frame 3");
    EXPECT_EQ(s.code(), c.code);
    EXPECT_EQ(s.message(), std::string("pwrite disk frame 3: ") + std::strerror(c.err) + " (errno " +
                               std::to_string(c.err) + ")");
  }
  const Status eio = Status::FromErrno(EIO, "pwrite disk frame 3");
  EXPECT_THAT(eio.message(), HasSubstr(std::strerror(EIO)));
  EXPECT_EQ(eio.ToString(), std::string("io error: pwrite disk frame 3: ") + std::strerror(EIO) + " (errno " +
                                std::to_string(EIO) + ")");
  const Status nospc = Status::FromErrno(ENOSPC, "fallocate");
  EXPECT_EQ(nospc.code(), StatusCode::kNoSpace);
  EXPECT_THAT(nospc.message(), HasSubstr(std::strerror(ENOSPC)));
}

TEST(StatusTest, AnnotatePrefixesAndKeepsCode) {
  const Status s = Status::NoSpace("disk full").Annotate("demote page 7");
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_EQ(s.message(), "demote page 7: disk full");
  const Status ok = Status::Ok().Annotate("context");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
}

// ---------------------------------------------------------------------------------
// Result and the macros

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> good(42);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 42);
  EXPECT_EQ(*good, 42);
  EXPECT_TRUE(good.status().ok());
  good.value() = 7;
  EXPECT_EQ(good.value(), 7);

  Result<int> bad(Status::NotFound("no page 9"));
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.status().message(), "no page 9");
}

TEST(ResultTest, MoveOnlyValueAndArrow) {
  Result<std::unique_ptr<std::string>> r(std::make_unique<std::string>("abc"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->size(), 3u);
  std::unique_ptr<std::string> owned = std::move(r).value();
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, "abc");

  const Result<std::string> s(std::string("xyz"));
  EXPECT_EQ(s->size(), 3u);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  TIERKV_ASSIGN_OR_RETURN(int h, Half(x));
  TIERKV_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  TIERKV_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(ResultTest, AssignOrReturnAndReturnIfError) {
  const Result<int> q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q.value(), 3);
  const Result<int> fail = Quarter(6);  // 6 / 2 = 3 is odd
  ASSERT_FALSE(fail.ok());
  EXPECT_EQ(fail.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fail.status().message(), "3 is odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------
// ParseSize

uint64_t ParseOk(const char* text) {
  const Result<uint64_t> r = ParseSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? r.value() : ~uint64_t{0};
}

TEST(ParseSizeTest, BinaryUnits) {
  EXPECT_EQ(ParseOk("512MiB"), 512ull << 20);
  EXPECT_EQ(ParseOk("8GiB"), 8ull << 30);
  EXPECT_EQ(ParseOk("64KiB"), 64ull << 10);
  EXPECT_EQ(ParseOk("2TiB"), 2ull << 40);
  EXPECT_EQ(ParseOk("4k"), 4096u);
  EXPECT_EQ(ParseOk("4K"), 4096u);
  EXPECT_EQ(ParseOk("3M"), 3ull << 20);
  EXPECT_EQ(ParseOk("1G"), 1ull << 30);
  EXPECT_EQ(ParseOk("1T"), 1ull << 40);
  EXPECT_EQ(ParseOk("1.5GiB"), 3ull << 29);
  EXPECT_EQ(ParseOk("0.5KiB"), 512u);
}

TEST(ParseSizeTest, DecimalUnitsPlainBytesCaseAndSpaces) {
  EXPECT_EQ(ParseOk("1.5GB"), 1500000000u);
  EXPECT_EQ(ParseOk("2KB"), 2000u);
  EXPECT_EQ(ParseOk("3MB"), 3000000u);
  EXPECT_EQ(ParseOk("1TB"), 1000000000000u);
  EXPECT_EQ(ParseOk("4096"), 4096u);
  EXPECT_EQ(ParseOk("4096B"), 4096u);
  EXPECT_EQ(ParseOk("0"), 0u);
  EXPECT_EQ(ParseOk("8gib"), 8ull << 30);
  EXPECT_EQ(ParseOk("512 MiB"), 512ull << 20);
  EXPECT_EQ(ParseOk("64 kb"), 64000u);
  // The largest exact binary size below the limit.
  EXPECT_EQ(ParseOk("1048576TiB"), 1ull << 60);
}

void ExpectInvalid(const char* text, const char* message_part) {
  SCOPED_TRACE(text);
  const Result<uint64_t> r = ParseSize(text);
  ASSERT_FALSE(r.ok()) << "parsed as " << r.value();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(message_part));
  EXPECT_THAT(r.status().message(), HasSubstr(Quoted(text)));  // names the input
}

TEST(ParseSizeTest, ErrorsSayWhy) {
  ExpectInvalid("", "does not start with a number");
  ExpectInvalid("abc", "does not start with a number");
  ExpectInvalid("MiB", "does not start with a number");
  ExpectInvalid("-5", "does not start with a number");
  ExpectInvalid("12xb", "unknown unit 'xb'");
  ExpectInvalid("5 parsecs", "unknown unit 'parsecs'");
  ExpectInvalid("1e3", "unknown unit 'e3'");
  ExpectInvalid("4KiBs", "unknown unit 'kibs'");
  ExpectInvalid(".", "malformed number");
  ExpectInvalid("1.5", "not a whole number of bytes");
  ExpectInvalid("0.5B", "not a whole number of bytes");
  // Huge values do not wrap around.
  ExpectInvalid("16777216TiB", "too large");  // exactly 2^64
  ExpectInvalid("99999999999999999999", "too large");
  ExpectInvalid("1000000000TB", "too large");
  // The unit list is offered.
  const Result<uint64_t> r = ParseSize("3 furlongs");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("GiB"));
}

// Regression: ParseSize once converted with std::llround (a signed long long), so sizes
// in [2^63, 2^64) overflowed: "10000000000000000000" parsed as 9223372036854775808.
TEST(ParseSizeTest, ValuesAboveInt64MaxAreExactOrRejected) {
  for (const char* text : {"10000000000000000000", "9000000TiB", "10000000TB"}) {
    SCOPED_TRACE(text);
    const Result<uint64_t> r = ParseSize(text);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    const long double expected = std::string(text) == "9000000TiB" ? 9000000.0L * 1099511627776.0L : 1e19L;
    EXPECT_EQ(r.value(), static_cast<uint64_t>(expected));
  }
}

// Regression: ParseSize once let std::stod stop at the second '.', accepting "1.2.3"
// as 1 byte and "1.5.5GiB" as 1.5 GiB.
TEST(ParseSizeTest, NumberWithTwoDotsIsMalformed) {
  ExpectInvalid("1.2.3", "malformed number");
  ExpectInvalid("1.5.5GiB", "malformed number");
}

// ---------------------------------------------------------------------------------
// FormatBytes

TEST(FormatBytesTest, ChoosesUnitAndPrecision) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(64 * kKiB), "64.0 KiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512 MiB");
  EXPECT_EQ(FormatBytes(100 * kMiB), "100 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(8 * kGiB), "8.00 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 40), "1.00 TiB");
  EXPECT_EQ(FormatBytes(uint64_t{1} << 50), "1024 TiB");  // TiB is the largest unit
}

TEST(FormatBytesTest, RoundTripsThroughParseSize) {
  for (const char* text : {"512MiB", "8GiB", "64KiB", "1.50GiB", "512B"}) {
    SCOPED_TRACE(text);
    const Result<uint64_t> r = ParseSize(text);
    ASSERT_TRUE(r.ok());
    const Result<uint64_t> again = ParseSize(FormatBytes(r.value()));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again.value(), r.value());
  }
}

// ---------------------------------------------------------------------------------
// types.h

TEST(TypesTest, TierNamesAndOrder) {
  EXPECT_STREQ(TierName(Tier::kDevice), "device");
  EXPECT_STREQ(TierName(Tier::kHost), "host");
  EXPECT_STREQ(TierName(Tier::kDisk), "disk");
  EXPECT_EQ(TierIndex(Tier::kDevice), 0);
  EXPECT_EQ(TierIndex(Tier::kDisk), 2);
  EXPECT_EQ(TierAt(1), Tier::kHost);
}

TEST(TypesTest, StrongIdValidityAndOrder) {
  EXPECT_FALSE(PageId().valid());
  EXPECT_TRUE(PageId(0).valid());
  EXPECT_EQ(PageId(), PageId(PageId::kInvalid));  // the default is the invalid id
  EXPECT_EQ(PageId(3).value, 3u);
  EXPECT_NE(PageId(3), PageId(4));  // equal only with the same value
  EXPECT_LT(FrameId(2), FrameId(5));
  EXPECT_EQ(std::hash<PageId>()(PageId(9)), std::hash<uint32_t>()(9u));
  // Pages and frames cannot be mixed up, nor made from a bare integer implicitly.
  static_assert(!std::is_convertible_v<PageId, FrameId> && !std::is_constructible_v<FrameId, PageId>);
  static_assert(!std::equality_comparable_with<PageId, FrameId>);
  static_assert(!std::is_convertible_v<uint32_t, PageId>);
}

}  // namespace
}  // namespace tierkv
