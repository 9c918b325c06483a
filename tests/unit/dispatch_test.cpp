// The dispatcher on fake adapters (every decision), and on the built-in
// registry through keel::logsumexp (the environment and the process default).
#include <cstdlib>
#include <memory>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <keel/keel.h>

#include "dispatch/logsumexp.h"
#include "dispatcher.h"
#include "support/scoped_env.h"

namespace keel::internal {
namespace {

// A kernel that serves every float32 CPU call or declines them all, and
// counts the questions.
class FakeKernel final : public LogsumexpKernel {
 public:
  explicit FakeKernel(bool serves)
      : capability_(serves ? Capability{} : Capability::none("logsumexp", "the fake declines")) {
    if (serves) {
      capability_.operation = "logsumexp";
      capability_.dtypes = {at::kFloat};
      capability_.devices = {c10::DeviceType::CPU};
    }
  }
  const Capability& capability() const noexcept override {
    ++asked;
    return capability_;
  }
  at::Tensor run(const LogsumexpCall& call) const override { return call.input; }
  mutable int asked = 0;

 private:
  Capability capability_;
};

class FakeAdapter final : public Adapter {
 public:
  FakeAdapter(Backend kind, bool serves) : kind_(kind), kernel_(serves) {}
  Backend kind() const noexcept override { return kind_; }
  std::string description() const override { return "fake"; }
  const LogsumexpKernel* logsumexp() const noexcept override { return &kernel_; }
  const FakeKernel& kernel() const { return kernel_; }

 private:
  Backend kind_;
  FakeKernel kernel_;
};

struct Fixture {
  Registry registry;
  const FakeAdapter* compat = nullptr;
  const FakeAdapter* native = nullptr;

  Fixture(bool native_present, bool native_serves) {
    auto c = std::make_unique<FakeAdapter>(Backend::compat, true);
    compat = c.get();
    registry.add(std::move(c));
    if (native_present) {
      auto n = std::make_unique<FakeAdapter>(Backend::native, native_serves);
      native = n.get();
      registry.add(std::move(n));
    }
  }
  result<Selection<LogsumexpKernel>> select_for(Backend backend) {
    const at::Tensor x = at::zeros({2});
    const at::Tensor none;
    const LogsumexpCall call{x, none, 0, false};
    return select(registry, "op", Request{backend, "call"}, call, &Adapter::logsumexp);
  }
};

TEST(Dispatcher, AutoPicksNativeWhenItServesTheWholeCall) {
  Fixture f(true, true);
  auto s = f.select_for(Backend::automatic);
  ASSERT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(s.value().kernel, f.native->logsumexp());
  EXPECT_EQ(s.value().info.served, Backend::native);
  EXPECT_EQ(s.value().info.adapter, to_string(s.value().info.served));
  EXPECT_EQ(s.value().info.requested, Backend::automatic);
}

TEST(Dispatcher, AutoFallsBackToCompatAndSaysWhy) {
  Fixture f(true, false);
  auto s = f.select_for(Backend::automatic);
  ASSERT_TRUE(s) << s.error().to_string();
  EXPECT_EQ(s.value().kernel, f.compat->logsumexp());
  EXPECT_EQ(s.value().info.served, Backend::compat);
  EXPECT_NE(s.value().info.reason.find("the fake declines"), std::string::npos);
}

TEST(Dispatcher, AutoWithoutNativeAdapterServesCompat) {
  Fixture f(false, false);
  auto s = f.select_for(Backend::automatic);
  ASSERT_TRUE(s);
  EXPECT_EQ(s.value().info.served, Backend::compat);
  EXPECT_NE(s.value().info.reason.find("no native adapter"), std::string::npos);
}

TEST(Dispatcher, NativeThatDeclinesIsUnsupportedNeverASilentFallback) {
  Fixture f(true, false);
  auto s = f.select_for(Backend::native);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), Errc::unsupported);
  EXPECT_NE(s.error().message().find("the fake declines"), std::string::npos);
}

TEST(Dispatcher, NativeOnABuildWithoutItIsUnsupportedNamingTheTorchRelease) {
  Fixture f(false, false);
  auto s = f.select_for(Backend::native);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), Errc::unsupported);
  EXPECT_NE(s.error().message().find("built against libtorch " + build_info().torch_version),
            std::string::npos)
      << s.error().message();
}

TEST(Dispatcher, CompatRequestNeverAsksNative) {
  Fixture f(true, true);
  auto s = f.select_for(Backend::compat);
  ASSERT_TRUE(s);
  EXPECT_EQ(s.value().info.served, Backend::compat);
  EXPECT_EQ(f.native->kernel().asked, 0);
}

TEST(Backend, ParsesExactlyTheThreeNames) {
  EXPECT_EQ(parse_backend("auto").value(), Backend::automatic);
  EXPECT_EQ(parse_backend(" compat ").value(), Backend::compat);
  EXPECT_EQ(parse_backend("native").value(), Backend::native);
  for (const char* bad : {"", "Native", "nativ", "unset", "auto,compat"}) {
    auto r = parse_backend(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find("'auto', 'compat' or 'native'"), std::string::npos);
  }
}

TEST(Request, CallThenEnvironmentThenProcessDefault) {
  testing::ScopedEnv env("KEEL_BACKEND", nullptr);
  set_default_backend(Backend::unset);
  EXPECT_EQ(resolve_request({}).value().backend, Backend::automatic);
  EXPECT_STREQ(resolve_request({}).value().source, "built-in default");

  set_default_backend(Backend::compat);
  EXPECT_EQ(default_backend(), Backend::compat);
  EXPECT_STREQ(resolve_request({}).value().source, "process default");
  {
    testing::ScopedEnv native("KEEL_BACKEND", "native");
    EXPECT_EQ(resolve_request({}).value().backend, Backend::native);
    EXPECT_STREQ(resolve_request({}).value().source, "KEEL_BACKEND");
    DispatchOptions per_call;
    per_call.backend = Backend::compat;
    EXPECT_EQ(resolve_request(per_call).value().backend, Backend::compat);
    EXPECT_STREQ(resolve_request(per_call).value().source, "call");
  }
  {
    testing::ScopedEnv blank("KEEL_BACKEND", "  ");  // blank counts as unset
    EXPECT_STREQ(resolve_request({}).value().source, "process default");
  }
  set_default_backend(Backend::unset);
  EXPECT_EQ(default_backend(), Backend::automatic);
}

TEST(Request, UnknownKeelBackendIsAnErrorListingTheValidValues) {
  testing::ScopedEnv env("KEEL_BACKEND", "fast");
  auto r = resolve_request({});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::invalid_argument);
  EXPECT_NE(r.error().message().find("KEEL_BACKEND='fast'"), std::string::npos);
  EXPECT_NE(r.error().message().find("'auto', 'compat' or 'native'"), std::string::npos);
  // ...and every operation reports it, rather than defaulting silently.
  auto op = logsumexp(at::zeros({2}));
  ASSERT_FALSE(op);
  EXPECT_EQ(op.error().code(), Errc::invalid_argument);
}

TEST(Request, OutOfRangeBackendValueIsInvalidArgument) {
  DispatchOptions o;
  o.backend = static_cast<Backend>(42);
  auto r = resolve_request(o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::invalid_argument);
}

TEST(BuiltinDispatch, EnvironmentSwitchesTheAdapterWithoutRebuild) {
  const bool has_native = build_info().adapters.size() == 2;
  {
    testing::ScopedEnv env("KEEL_BACKEND", "compat");
    auto r = logsumexp(at::zeros({2, 2}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r.value().dispatch.served, Backend::compat);
    EXPECT_EQ(r.value().dispatch.requested_by, "KEEL_BACKEND");
  }
  {
    testing::ScopedEnv env("KEEL_BACKEND", "native");
    auto r = logsumexp(at::zeros({2, 2}));
    ASSERT_EQ(static_cast<bool>(r), has_native);
    if (!has_native) {
      EXPECT_EQ(r.error().code(), Errc::unsupported);
    }
  }
  testing::ScopedEnv env("KEEL_BACKEND", nullptr);
  auto r = logsumexp(at::zeros({2, 2}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().dispatch.served, has_native ? Backend::native : Backend::compat);
}

TEST(BuiltinDispatch, KeelLogDispatchLogsEachDecision) {
  testing::ScopedEnv backend("KEEL_BACKEND", nullptr);
  testing::ScopedEnv log("KEEL_LOG", "comm, dispatch");
  ::testing::internal::CaptureStderr();
  LogsumexpOptions o;
  o.mask = at::ones({3}, at::kBool);
  ASSERT_TRUE(logsumexp(at::zeros({3}), o));
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("[keel dispatch "), std::string::npos) << logged;
  EXPECT_NE(logged.find("logsumexp -> compat"), std::string::npos) << logged;
}

TEST(BuiltinDispatch, NothingIsLoggedWithoutKeelLog) {
  testing::ScopedEnv log("KEEL_LOG", nullptr);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(logsumexp(at::zeros({3})));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace keel::internal
