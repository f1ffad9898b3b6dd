#include "serving/http/rest_routes.h"

#include <gtest/gtest.h>

#include <string>

namespace numaserve::serving::http {
namespace {

Route Match(const std::string& path) {
  absl::StatusOr<Route> route = MatchRoute(path);
  EXPECT_TRUE(route.ok()) << path << ": " << route.status();
  return route.ok() ? *route : Route{};
}

TEST(RestRoutesTest, ServerRoutes) {
  EXPECT_EQ(Match("/v2").kind, Route::Kind::kServerMetadata);
  EXPECT_EQ(Match("/v2/").kind, Route::Kind::kServerMetadata);
  EXPECT_EQ(Match("/v2/health/live").kind, Route::Kind::kLive);
  EXPECT_TRUE(Match("/v2/health/live").open());
  EXPECT_EQ(Match("/v2/health/ready").kind, Route::Kind::kReady);
  EXPECT_TRUE(Match("/v2/health/ready").open());
  EXPECT_FALSE(Match("/v2").open());
  const Route stats = Match("/v2/models/stats");
  EXPECT_EQ(stats.kind, Route::Kind::kModelStats);
  EXPECT_EQ(stats.model, "");
  EXPECT_STREQ(stats.method, "GET");
}

TEST(RestRoutesTest, ModelRoutes) {
  const Route metadata = Match("/v2/models/mlp");
  EXPECT_EQ(metadata.kind, Route::Kind::kModelMetadata);
  EXPECT_EQ(metadata.model, "mlp");
  EXPECT_EQ(metadata.version, "");
  const Route versioned = Match("/v2/models/mlp/versions/3/infer");
  EXPECT_EQ(versioned.kind, Route::Kind::kInfer);
  EXPECT_EQ(versioned.model, "mlp");
  EXPECT_EQ(versioned.version, "3");
  EXPECT_STREQ(versioned.method, "POST");
  EXPECT_EQ(Match("/v2/models/mlp/ready").kind, Route::Kind::kModelReady);
  EXPECT_EQ(Match("/v2/models/mlp/versions/2/ready").kind, Route::Kind::kModelReady);
  EXPECT_EQ(Match("/v2/models/mlp/config").kind, Route::Kind::kModelConfig);
  EXPECT_EQ(Match("/v2/models/mlp/versions/2").kind, Route::Kind::kModelMetadata);
  const Route stats = Match("/v2/models/mlp/versions/2/stats");
  EXPECT_EQ(stats.kind, Route::Kind::kModelStats);
  EXPECT_EQ(stats.version, "2");
}

TEST(RestRoutesTest, RepositoryRoutes) {
  const Route index = Match("/v2/repository/index");
  EXPECT_EQ(index.kind, Route::Kind::kRepositoryIndex);
  EXPECT_STREQ(index.method, "POST");
  const Route load = Match("/v2/repository/models/mlp/load");
  EXPECT_EQ(load.kind, Route::Kind::kLoad);
  EXPECT_EQ(load.model, "mlp");
  EXPECT_STREQ(load.method, "POST");
  EXPECT_EQ(Match("/v2/repository/models/mlp/unload").kind, Route::Kind::kUnload);
}

TEST(RestRoutesTest, NamesArePercentDecoded) {
  EXPECT_EQ(Match("/v2/models/my%20model%2Fv/infer").model, "my model/v");
  EXPECT_EQ(Match("/v2/models/caf%C3%A9").model, "caf\xc3\xa9");
}

TEST(RestRoutesTest, UnknownPathsAreNotFound) {
  for (const char* path :
       {"", "/", "/v1/models/m", "/v2/models", "/v2/models/m/explain", "/v2/models/m/versions",
        "/v2/models/m/versions/1/infer/x", "/v2/health", "/v2/health/alive", "/v2/repository",
        "/v2/repository/models/m", "/v2/repository/models/m/reload", "/v2//infer",
        "/v2/models//infer", "/metrics", "v2"}) {
    absl::StatusOr<Route> route = MatchRoute(path);
    ASSERT_FALSE(route.ok()) << "matched '" << path << "'";
    EXPECT_EQ(route.status().code(), absl::StatusCode::kNotFound) << path;
  }
}

TEST(RestRoutesTest, NamesThatAreNotTextAreInvalid) {
  for (const char* path :
       {"/v2/models/%ff%fe", "/v2/models/a%00b/infer", "/v2/models/a%zz", "/v2/models/a%4",
        "/v2/models/m/versions/%c3/ready", "/v2/repository/models/%80/load"}) {
    absl::StatusOr<Route> route = MatchRoute(path);
    ASSERT_FALSE(route.ok()) << "matched '" << path << "'";
    EXPECT_EQ(route.status().code(), absl::StatusCode::kInvalidArgument) << path;
  }
}

TEST(RestRoutesTest, PercentDecode) {
  EXPECT_EQ(*PercentDecode("a%41%62c"), "aAbc");
  EXPECT_EQ(*PercentDecode("plus+stays"), "plus+stays");
  EXPECT_FALSE(PercentDecode("%").ok());
  EXPECT_FALSE(PercentDecode("%4").ok());
  EXPECT_FALSE(PercentDecode("%g0").ok());
}

}  // namespace
}  // namespace numaserve::serving::http
