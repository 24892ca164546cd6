// Status, StatusOr, RETURN_IF_ERROR / ASSIGN_OR_RETURN and StrCat: what callers rely on when
// they pass errors up to the API layer.
#include "util/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

TEST(StatusTest, DefaultIsOk) {
  const Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().code(), StatusCode::kOk);
}

TEST(StatusTest, HelpersSetCodeAndKeepMessage) {
  struct Case {
    Status status;
    StatusCode code;
    std::string text;
  };
  const std::vector<Case> cases = {
      {InvalidArgument("steps must be > 0"), StatusCode::kInvalidArgument,
       "INVALID_ARGUMENT: steps must be > 0"},
      {NotFound("no pipeline sd15"), StatusCode::kNotFound, "NOT_FOUND: no pipeline sd15"},
      {FailedPrecondition("not loaded"), StatusCode::kFailedPrecondition,
       "FAILED_PRECONDITION: not loaded"},
      {ResourceExhausted("queue full"), StatusCode::kResourceExhausted,
       "RESOURCE_EXHAUSTED: queue full"},
      {Unavailable("draining"), StatusCode::kUnavailable, "UNAVAILABLE: draining"},
      {Internal("cuda error"), StatusCode::kInternal, "INTERNAL: cuda error"},
      {Cancelled("client left"), StatusCode::kCancelled, "CANCELLED: client left"},
      {DeadlineExceeded("too slow"), StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED: too slow"},
      {AlreadyExists("sd15 loaded"), StatusCode::kAlreadyExists, "ALREADY_EXISTS: sd15 loaded"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.ToString(), c.text);
    EXPECT_EQ(c.status.message(), c.text.substr(c.text.find(": ") + 2));
  }
}

TEST(StatusTest, ConstructorTakesAnyCode) {
  const Status status(StatusCode::kPermissionDenied, "read-only");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(), "read-only");
  EXPECT_EQ(status.ToString(), "PERMISSION_DENIED: read-only");
}

TEST(StatusTest, CodeNamesMatchGrpc) {
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_STREQ(StatusCodeName(StatusCode::kCancelled), "CANCELLED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kNotFound), "NOT_FOUND");
  EXPECT_STREQ(StatusCodeName(StatusCode::kAlreadyExists), "ALREADY_EXISTS");
  EXPECT_STREQ(StatusCodeName(StatusCode::kPermissionDenied), "PERMISSION_DENIED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kFailedPrecondition), "FAILED_PRECONDITION");
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnavailable), "UNAVAILABLE");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInternal), "INTERNAL");
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
}

TEST(StatusOrTest, HoldsValue) {
  StatusOr<std::string> result(std::string("image"));
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result.status().ok());
  EXPECT_EQ(result.value(), "image");
  EXPECT_EQ(*result, "image");
  EXPECT_EQ(result->size(), 5u);
  result.value() += "s";
  EXPECT_EQ(*result, "images");

  const StatusOr<int> number = 7;
  ASSERT_TRUE(number.ok());
  EXPECT_EQ(number.value(), 7);
  EXPECT_EQ(*number, 7);
}

TEST(StatusOrTest, HoldsError) {
  const StatusOr<int> result = NotFound("no such component");
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(result.status().message(), "no such component");
}

// An OK status carries no value: a StatusOr made from one is not ok, and says why.
TEST(StatusOrTest, MadeFromAnOkStatusIsAnInternalError) {
  const StatusOr<int> result = Status::Ok();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
  EXPECT_NE(result.status().message().find("without a value"), std::string::npos);
  Status ok;
  const StatusOr<std::string> moved = std::move(ok);
  EXPECT_EQ(moved.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MovesOutMoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> result(std::make_unique<int>(42));
  ASSERT_TRUE(result.ok());
  std::unique_ptr<int> taken = std::move(result).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 42);
}

// Helpers for the macro tests: `calls` counts how far a function got.
Status Fails(int* calls) {
  ++*calls;
  return Unavailable("worker stopped");
}

Status Succeeds(int* calls) {
  ++*calls;
  return Status::Ok();
}

StatusOr<int> Half(int n) {
  if (n % 2 != 0) return InvalidArgument("odd: " + std::to_string(n));
  return n / 2;
}

Status RunTwo(bool fail_first, int* calls) {
  RETURN_IF_ERROR(fail_first ? Fails(calls) : Succeeds(calls));
  RETURN_IF_ERROR(Succeeds(calls));
  return Status::Ok();
}

TEST(ReturnIfErrorTest, ContinuesOnOk) {
  int calls = 0;
  EXPECT_TRUE(RunTwo(false, &calls).ok());
  EXPECT_EQ(calls, 2);
}

TEST(ReturnIfErrorTest, ReturnsFirstErrorAndStops) {
  int calls = 0;
  const Status status = RunTwo(true, &calls);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "worker stopped");
  EXPECT_EQ(calls, 1);  // the expression ran once and nothing after it
}

// RETURN_IF_ERROR is one statement: it may stand alone in an unbraced if / else.
Status Branch(bool fail, int* calls) {
  if (fail)
    RETURN_IF_ERROR(Fails(calls));
  else
    RETURN_IF_ERROR(Succeeds(calls));
  return Internal("reached the end");
}

TEST(ReturnIfErrorTest, IsOneStatement) {
  int calls = 0;
  EXPECT_EQ(Branch(true, &calls).code(), StatusCode::kUnavailable);
  EXPECT_EQ(Branch(false, &calls).code(), StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
}

StatusOr<int> CheckedSum(bool fail, int* calls) {
  RETURN_IF_ERROR(fail ? Fails(calls) : Succeeds(calls));
  return 3;
}

TEST(ReturnIfErrorTest, WorksInStatusOrFunction) {
  int calls = 0;
  const StatusOr<int> ok = CheckedSum(false, &calls);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
  const StatusOr<int> failed = CheckedSum(true, &calls);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
}

// Quarters n through two ASSIGN_OR_RETURN in one scope; `reached` records how far it got.
StatusOr<int> Quarter(int n, int* reached) {
  *reached = 0;
  ASSIGN_OR_RETURN(const int half, Half(n));
  *reached = 1;
  ASSIGN_OR_RETURN(int quarter, Half(half));
  *reached = 2;
  return quarter;
}

TEST(AssignOrReturnTest, AssignsValues) {
  int reached = -1;
  const StatusOr<int> result = Quarter(12, &reached);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(*result, 3);
  EXPECT_EQ(reached, 2);
}

TEST(AssignOrReturnTest, PropagatesErrorAndStops) {
  int reached = -1;
  StatusOr<int> result = Quarter(7, &reached);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "odd: 7");
  EXPECT_EQ(reached, 0);

  result = Quarter(6, &reached);  // 6 / 2 = 3 is odd: the second one fails
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "odd: 3");
  EXPECT_EQ(reached, 1);
}

// ASSIGN_OR_RETURN into an existing variable, in a function that returns a plain Status.
Status HalveInto(int n, int* out) {
  int value = 0;
  ASSIGN_OR_RETURN(value, Half(n));
  *out = value;
  return Status::Ok();
}

TEST(AssignOrReturnTest, AssignsExistingVariableInStatusFunction) {
  int out = -1;
  EXPECT_TRUE(HalveInto(10, &out).ok());
  EXPECT_EQ(out, 5);
  const Status status = HalveInto(5, &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 5);  // untouched on error
}

StatusOr<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return InvalidArgument("negative");
  return std::make_unique<int>(v);
}

StatusOr<int> Unbox(int v) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));
  return *box + 1;
}

TEST(AssignOrReturnTest, MovesMoveOnlyValue) {
  const StatusOr<int> ok = Unbox(41);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 42);
  const StatusOr<int> failed = Unbox(-1);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().message(), "negative");
}

TEST(StrCatTest, ConcatenatesStreamableValues) {
  EXPECT_EQ(StrCat("loaded ", std::string("sd15"), " in ", 2, " s"), "loaded sd15 in 2 s");
  EXPECT_EQ(StrCat(1.5, '/', 3u, "/", -4L), "1.5/3/-4");
  EXPECT_EQ(StrCat("only"), "only");
  EXPECT_EQ(StrCat(InvalidArgument("x").ToString()), "INVALID_ARGUMENT: x");
}

}  // namespace
}  // namespace qpool
