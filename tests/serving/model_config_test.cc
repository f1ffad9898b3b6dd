#include "serving/repository/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serving/repository/model_warmup.h"

namespace numaserve::serving {
namespace {

using ::testing::HasSubstr;

engine::ModelInfo Mlp(bool batched = true) {
  engine::ModelInfo info;
  info.path = "mlp/1/model.onnx";
  info.batched = batched;
  info.inputs = {{"input", engine::DataType::kFloat32, {batched ? -1 : 1, 784}}};
  info.outputs = {{"probabilities", engine::DataType::kFloat32, {batched ? -1 : 1, 10}}};
  return info;
}

config::ModelConfig Parse(const std::string& text) {
  auto c = ParseModelConfigText(text, "mlp/config.pbtxt");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : config::ModelConfig();
}

TEST(ModelConfig, ParsesEveryBlock) {
  auto c = Parse(R"pb(
    name: "mlp"
    max_batch_size: 32
    dynamic_batching {
      preferred_batch_size: [ 8, 16 ]
      max_queue_delay_microseconds: 500
      max_queue_size: 100
      default_timeout_microseconds: 2000000
    }
    instance_placement { domains: [ 0 ] }
    version_policy { latest { num_versions: 2 } }
    gemm_backend: "onednn"
    input {
      name: "input"
      data_type: "FP32"
      dims: [ 784 ]
    }
  )pb");
  EXPECT_EQ(c.max_batch_size(), 32);
  EXPECT_EQ(c.dynamic_batching().preferred_batch_size_size(), 2);
  EXPECT_EQ(c.dynamic_batching().max_queue_delay_microseconds(), 500u);
  EXPECT_EQ(c.version_policy().latest().num_versions(), 2u);
  EXPECT_TRUE(ValidateModelConfig(c, "mlp", Mlp(), 1).ok());
}

TEST(ModelConfig, PrecisionIsFp32OrBf16) {
  EXPECT_EQ(Parse("").precision(), "");  // the default: FP32
  for (const char* value : {"fp32", "bf16"}) {
    const config::ModelConfig c = Parse(absl::StrCat("precision: \"", value, "\""));
    EXPECT_EQ(c.precision(), value);
    EXPECT_TRUE(ValidateModelConfigFields(c, "mlp", 1).ok()) << value;
    EXPECT_TRUE(ValidateModelConfig(c, "mlp", Mlp(), 1).ok()) << value;
  }
  // An unknown word is refused by the config checks, naming the field.
  absl::Status s = ValidateModelConfigFields(Parse("precision: \"int8\""), "mlp", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("model 'mlp' config.pbtxt: precision: 'int8' is not one of fp32, bf16"));
  // Not a string: a parse error with its line and column.
  auto number = ParseModelConfigText("precision: 16\n", "repo/mlp/config.pbtxt");
  ASSERT_FALSE(number.ok());
  EXPECT_THAT(std::string(number.status().message()), HasSubstr("repo/mlp/config.pbtxt:1:"));
}

TEST(ModelConfig, SyntaxErrorNamesFileLineAndField) {
  auto c = ParseModelConfigText("max_batch_size: 8\nmax_batch_sise: 4\n", "repo/mlp/config.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("repo/mlp/config.pbtxt:2:"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("max_batch_sise"));
}

TEST(ModelConfig, WrongValueTypeIsAnError) {
  auto c = ParseModelConfigText("max_batch_size: \"many\"\n", "c.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("c.pbtxt:1:"));
}

TEST(ModelConfig, ContradictionsWithTheOnnxModelAreErrors) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"name: \"other\"", "name"},
      {"max_batch_size: 4 dynamic_batching { preferred_batch_size: 8 }", "preferred_batch_size"},
      {"dynamic_batching {}", "needs max_batch_size"},
      {"input { name: \"image\" }", "no such tensor"},
      {"max_batch_size: 4 input { name: \"input\" data_type: \"INT64\" }", "data_type"},
      {"max_batch_size: 4 input { name: \"input\" data_type: \"FP32\" dims: [ 28, 28 ] }", "dims"},
      {"output { name: \"probabilities\" dims: [ 10 ] }", "dims"},  // no batch: rank 2
      {"instance_placement { domains: [ 3 ] }", "worker 3 does not exist"},
      {"gemm_backend: \"cublas\"", "gemm_backend"},
      {"precision: \"fp16\"",
       "model 'mlp' config.pbtxt: precision: 'fp16' is not one of fp32, bf16"},
      {"precision: \"BF16\"", "precision: 'BF16' is not one of fp32, bf16"},
  };
  for (const auto& c : cases) {
    absl::Status s = ValidateModelConfig(Parse(c.text), "mlp", Mlp(), 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect)) << c.text << " -> " << s;
  }
}

TEST(ModelConfig, DataTypesOfEveryKindInKServeOrTritonSpelling) {
  engine::ModelInfo info;
  info.path = "bert/1/model.onnx";
  info.batched = true;
  info.inputs = {{"input_ids", engine::DataType::kInt64, {-1, 8}},
                 {"scale", engine::DataType::kFloat16, {-1, 1}}};
  info.outputs = {{"padding", engine::DataType::kBool, {-1, 8}}};
  for (const char* text : {
           R"pb(max_batch_size: 4
                input {
                  name: "input_ids"
                  data_type: "INT64"
                  dims: [ 8 ]
                }
                input {
                  name: "scale"
                  data_type: "FP16"
                  dims: [ 1 ]
                }
                output {
                  name: "padding"
                  data_type: "BOOL"
                  dims: [ 8 ]
                })pb",
           R"pb(max_batch_size: 4
                input {
                  name: "input_ids"
                  data_type: "TYPE_INT64"
                  dims: [ 8 ]
                }
                input {
                  name: "scale"
                  data_type: "TYPE_FP16"
                  dims: [ 1 ]
                }
                output {
                  name: "padding"
                  data_type: "TYPE_BOOL"
                  dims: [ 8 ]
                })pb"}) {
    absl::Status s = ValidateModelConfig(Parse(text), "bert", info, 1);
    EXPECT_TRUE(s.ok()) << text << " -> " << s;
  }
  absl::Status s =
      ValidateModelConfig(Parse(R"pb(max_batch_size: 4
                                     input { name: "input_ids" data_type: "TYPE_INT32" })pb"),
                          "bert", info, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'input_ids' data_type"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'TYPE_INT32' but the ONNX model says INT64"));
}

TEST(ModelConfig, SeveralInstancesPerDomainAreAccepted) {
  EXPECT_TRUE(
      ValidateModelConfig(Parse("instance_placement { instances_per_domain: 2 }"), "mlp", Mlp(), 2)
          .ok());
  EXPECT_TRUE(CheckInstancesFit("mlp", 2, 0, 2).ok());
  EXPECT_TRUE(CheckInstancesFit("mlp", 1, 0, 1).ok());
  EXPECT_TRUE(CheckInstancesFit("mlp", 0, 0, 1).ok());  // unset: one
}

TEST(ModelConfig, ParseInstancesTakesACountAutoOrPerCore) {
  EXPECT_EQ(*ParseInstances("auto"), kInstancesAuto);
  EXPECT_EQ(*ParseInstances("per_core"), kInstancesPerCore);
  EXPECT_EQ(*ParseInstances("1"), 1);
  EXPECT_EQ(*ParseInstances("4"), 4);
  EXPECT_EQ(*ParseInstances("1024"), 1024);
  for (const char* bad : {"0", "-1", "-2", "1025", "many", "", "AUTO", "per-core", "2x"}) {
    auto n = ParseInstances(bad);
    ASSERT_FALSE(n.ok()) << bad;
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(n.status().message()),
                HasSubstr("expected a count 1..1024, auto or per_core"))
        << bad;
  }
  EXPECT_EQ(FormatInstances(kInstancesAuto), "auto");
  EXPECT_EQ(FormatInstances(kInstancesPerCore), "per_core");
  EXPECT_EQ(FormatInstances(0), "1");
  EXPECT_EQ(FormatInstances(3), "3");
}

TEST(ModelConfig, InstancesPerDomainAutoAndPerCoreParse) {
  auto c = Parse("instance_placement { instances_per_domain: auto }");
  EXPECT_EQ(c.instance_placement().instances_per_domain(), kInstancesAuto);
  EXPECT_TRUE(ValidateModelConfig(c, "mlp", Mlp(), 2).ok());
  c = Parse("instance_placement {\n  instances_per_domain:per_core  # one per core\n}\n");
  EXPECT_EQ(c.instance_placement().instances_per_domain(), kInstancesPerCore);
  EXPECT_TRUE(ValidateModelConfig(c, "mlp", Mlp(), 2).ok());
  c = Parse("instance_placement { instances_per_domain : 3 }");
  EXPECT_EQ(c.instance_placement().instances_per_domain(), 3);
  // Only the field's value: a string or a comment that says the same stays.
  c = Parse(
      "# instances_per_domain: auto\n"
      "name: \"instances_per_domain: per_core\"\n"
      "instance_placement { instances_per_domain: auto }\n");
  EXPECT_EQ(c.name(), "instances_per_domain: per_core");
  EXPECT_EQ(c.instance_placement().instances_per_domain(), kInstancesAuto);
  // Other words are TextFormat's to refuse.
  EXPECT_FALSE(ParseModelConfigText("instance_placement { instances_per_domain: automatic }",
                                    "mlp/config.pbtxt")
                   .ok());
  EXPECT_FALSE(ParseModelConfigText("instance_placement { instances_per_domain: \"auto\" }",
                                    "mlp/config.pbtxt")
                   .ok());
}

TEST(ModelConfig, ANegativeInstancesPerDomainIsRefused) {
  for (const char* text : {"instance_placement { instances_per_domain: -1 }",
                           "instance_placement { instances_per_domain: -2 }",
                           "instance_placement { instances_per_domain: -5 }"}) {
    auto c = ParseModelConfigText(text, "repo/mlp/config.pbtxt");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(c.status().message());
    EXPECT_THAT(message, HasSubstr("repo/mlp/config.pbtxt:1:44: "));
    EXPECT_THAT(message, HasSubstr("instance_placement.instances_per_domain"));
    EXPECT_THAT(message, HasSubstr("expected a count >= 1, auto or per_core"));
  }
  // Set otherwise than from the file: validation refuses it.
  config::ModelConfig c;
  c.mutable_instance_placement()->set_instances_per_domain(-3);
  absl::Status s = ValidateModelConfig(c, "mlp", Mlp(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.pbtxt"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("instance_placement.instances_per_domain"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected a count >= 1, auto or per_core"));
  c.mutable_instance_placement()->set_instances_per_domain(1025);
  EXPECT_EQ(ValidateModelConfig(c, "mlp", Mlp(), 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfig, ErrorsAfterAutoOrPerCoreKeepTheirLineAndColumn) {
  // The same file with a count of the word's length in its place: the
  // error must be reported at the same place.
  for (const auto& [word, count] :
       {std::pair<std::string, std::string>{"auto", "2   "}, {"per_core", "2       "}}) {
    for (const std::string& tail :
         {std::string(" max_batch_sise: 4\n"), std::string("\n  max_batch_sise: 4\n")}) {
      const std::string head = "instance_placement {\n  instances_per_domain: ";
      auto with_word = ParseModelConfigText(head + word + " }" + tail, "m/config.pbtxt");
      auto with_count = ParseModelConfigText(head + count + " }" + tail, "m/config.pbtxt");
      ASSERT_FALSE(with_word.ok());
      ASSERT_FALSE(with_count.ok());
      EXPECT_EQ(with_word.status().message(), with_count.status().message()) << word << tail;
      EXPECT_THAT(std::string(with_word.status().message()), HasSubstr("max_batch_sise"));
    }
  }
}

TEST(ModelConfig, AutoAndPerCoreFitAnyWorker) {
  EXPECT_TRUE(CheckInstancesFit("mlp", kInstancesAuto, 0, 1).ok());
  EXPECT_TRUE(CheckInstancesFit("mlp", kInstancesPerCore, 0, 1).ok());
}

TEST(ModelConfig, MoreInstancesThanCoresAreRefused) {
  absl::Status s = CheckInstancesFit("mlp", 3, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("model 'mlp' config.pbtxt"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("instance_placement.instances_per_domain"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("worker 1 has 2 cores"));
}

TEST(ModelConfig, BatchingNeedsADynamicBatchDimension) {
  absl::Status s = ValidateModelConfig(Parse("max_batch_size: 8"), "mlp", Mlp(false), 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_batch_size"));
  EXPECT_TRUE(ValidateModelConfig(Parse("max_batch_size: 0"), "mlp", Mlp(false), 1).ok());
}

TEST(ModelConfig, VersionPolicies) {
  const std::vector<int64_t> on_disk = {1, 2, 5};
  EXPECT_EQ(*SelectVersions(Parse(""), on_disk), (std::vector<int64_t>{5}));
  EXPECT_EQ(*SelectVersions(Parse("version_policy { latest { num_versions: 2 } }"), on_disk),
            (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(*SelectVersions(Parse("version_policy { latest { num_versions: 9 } }"), on_disk),
            on_disk);
  EXPECT_EQ(*SelectVersions(Parse("version_policy { all {} }"), on_disk), on_disk);
  EXPECT_EQ(*SelectVersions(Parse("version_policy { specific { versions: [ 2, 1 ] } }"), on_disk),
            (std::vector<int64_t>{1, 2}));
  auto missing = SelectVersions(Parse("version_policy { specific { versions: 3 } }"), on_disk);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelConfig, PlacementPicksWorkers) {
  EXPECT_EQ(PlacementWorkers(Parse(""), 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(PlacementWorkers(Parse("instance_placement { all: true }"), 2),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(PlacementWorkers(Parse("instance_placement { domains: [ 2, 0, 2 ] }"), 3),
            (std::vector<int>{0, 2}));
}

TEST(ModelConfig, MaxActivationBytesIsBoundedAt1PiB) {
  EXPECT_EQ(Parse("").max_activation_bytes(), 0u);  // the server's --max-activation-mb
  EXPECT_EQ(Parse("max_activation_bytes: 1048576").max_activation_bytes(), 1048576u);
  EXPECT_TRUE(
      ValidateModelConfigFields(Parse("max_activation_bytes: 1125899906842624"), "mlp", 1).ok());
  // Above 1 PiB, and 2^64 - 1, which as the engine's int64 would be -1.
  for (const char* value : {"1125899906842625", "18446744073709551615"}) {
    absl::Status s =
        ValidateModelConfigFields(Parse(absl::StrCat("max_activation_bytes: ", value)), "mlp", 1);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("model 'mlp' config.pbtxt: max_activation_bytes: ", value,
                                       " is above the limit of 1125899906842624")));
  }
}

TEST(ModelConfig, DurationsThatWouldOverflowAsClockDurationsAreRefused) {
  // 2^64 - 1 microseconds: before, a negative std::chrono::microseconds and
  // an overflowing deadline for every request.
  for (const std::string field : {"default_timeout_microseconds", "max_queue_delay_microseconds"}) {
    const std::string text =
        "max_batch_size: 8 dynamic_batching { " + field + ": 18446744073709551615 }";
    absl::Status s = ValidateModelConfigFields(Parse(text), "mlp", 1);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(s.message()), HasSubstr("model 'mlp' config.pbtxt"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("dynamic_batching." + field));
    EXPECT_THAT(std::string(s.message()), HasSubstr("18446744073709551615 is above the limit"));
    // 2^63 / 1000 + 1: fits uint64 and int64 microseconds, overflows as ns.
    EXPECT_FALSE(ValidateModelConfigFields(Parse("max_batch_size: 8 dynamic_batching { " + field +
                                                 ": 9223372036854776 }"),
                                           "mlp", 1)
                     .ok())
        << field;
    // A day is accepted.
    EXPECT_TRUE(
        ValidateModelConfigFields(
            Parse("max_batch_size: 8 dynamic_batching { " + field + ": 86400000000 }"), "mlp", 1)
            .ok())
        << field;
  }
  EXPECT_FALSE(ValidateModelConfig(
                   Parse("max_batch_size: 8 dynamic_batching { default_timeout_microseconds: "
                         "86400000001 }"),
                   "mlp", Mlp(), 1)
                   .ok());
}

// --- Triton's schema -------------------------------------------------------

// A config.pbtxt as Triton's CPU ONNX Runtime backend takes it.
constexpr char kTritonConfig[] = R"pb(
  name: "mlp"
  platform: "onnxruntime_onnx"
  max_batch_size: 8 input
  [ {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 784 ]
  }] output
  [ {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }] instance_group
  [ { count: 2 kind: KIND_CPU }]
  dynamic_batching {
    preferred_batch_size: [ 4, 8 ]
    max_queue_delay_microseconds: 100
    default_queue_policy { default_timeout_microseconds: 250000 max_queue_size: 64 }
  }
  version_policy: { latest { num_versions: 1 } }
  optimization {
    execution_accelerators {
      cpu_execution_accelerator:
      [ { name: "openvino" }]
    }
  }
  parameters {
    key: "intra_op_thread_count"
    value: { string_value: "4" }
  } model_warmup
  [ {
    name: "w"
    batch_size: 1
    inputs {
      key: "input"
      value: {
        data_type: TYPE_FP32
        dims: [ 784 ]
        zero_data: true
      }
    }
  }]
  default_model_filename: "model.onnx"
)pb";

ModelConfigFile ReadTriton(const std::string& text, int num_workers = 1) {
  auto f = ReadModelConfigText(text, "repo/mlp/config.pbtxt", num_workers);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : ModelConfigFile();
}

TEST(TritonConfig, ParsesAndConverts) {
  ModelConfigFile f = ReadTriton(kTritonConfig);
  EXPECT_TRUE(f.triton);
  const config::ModelConfig& c = f.config;
  EXPECT_EQ(c.name(), "mlp");
  EXPECT_EQ(c.max_batch_size(), 8);
  ASSERT_EQ(c.input_size(), 1);
  EXPECT_EQ(c.input(0).name(), "input");
  EXPECT_EQ(c.input(0).data_type(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(c.input(0).dims().begin(), c.input(0).dims().end()),
            (std::vector<int64_t>{784}));
  ASSERT_EQ(c.output_size(), 1);
  EXPECT_EQ(c.output(0).data_type(), "FP32");
  EXPECT_EQ(c.instance_placement().instances_per_domain(), 2);
  EXPECT_EQ(c.dynamic_batching().preferred_batch_size_size(), 2);
  EXPECT_EQ(c.dynamic_batching().max_queue_delay_microseconds(), 100u);
  EXPECT_EQ(c.dynamic_batching().default_timeout_microseconds(), 250000u);
  EXPECT_EQ(c.dynamic_batching().max_queue_size(), 64u);
  EXPECT_EQ(c.version_policy().latest().num_versions(), 1u);
  EXPECT_TRUE(ValidateModelConfig(c, "mlp", Mlp(), 1).ok());
  // The same config in numaserve's schema reads the same.
  EXPECT_FALSE(ReadTriton("max_batch_size: 8").triton);
}

TEST(TritonConfig, BackendInsteadOfPlatform) {
  ModelConfigFile f = ReadTriton("backend: \"onnxruntime\" max_batch_size: 0");
  EXPECT_TRUE(f.triton);
  EXPECT_EQ(f.config.max_batch_size(), 0);
  EXPECT_TRUE(f.ignored_fields.empty());
  EXPECT_EQ(f.config.instance_placement().instances_per_domain(), 0);  // the server's default
}

TEST(TritonConfig, VersionPolicies) {
  const std::vector<int64_t> on_disk = {1, 2, 3};
  const std::string head = "platform: \"onnxruntime_onnx\" ";
  EXPECT_EQ(*SelectVersions(ReadTriton(head + "version_policy: { all {} }").config, on_disk),
            on_disk);
  EXPECT_EQ(
      *SelectVersions(ReadTriton(head + "version_policy: { specific { versions: [1,3] } }").config,
                      on_disk),
      (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(
      *SelectVersions(ReadTriton(head + "version_policy: { latest { num_versions: 2 } }").config,
                      on_disk),
      (std::vector<int64_t>{2, 3}));
}

TEST(TritonConfig, DataTypesLoseTheirPrefix) {
  ModelConfigFile f = ReadTriton(
      "input [ { name: \"a\" data_type: TYPE_INT64 dims: [ 2 ] },"
      "        { name: \"b\" data_type: TYPE_STRING dims: [ 1 ] },"
      "        { name: \"c\" dims: [ 1 ] } ]");
  ASSERT_EQ(f.config.input_size(), 3);
  EXPECT_EQ(f.config.input(0).data_type(), "INT64");
  EXPECT_EQ(f.config.input(1).data_type(), "BYTES");
  EXPECT_EQ(f.config.input(2).data_type(), "");  // unset: not checked
  // A type contradicting the ONNX file is a load error, as in numaserve's form.
  ModelConfigFile wrong = ReadTriton(
      "max_batch_size: 4 input [ { name: \"input\" data_type: TYPE_INT32 dims: [ 784 ] } ]");
  absl::Status s = ValidateModelConfig(wrong.config, "mlp", Mlp(), 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'input' data_type"));
}

TEST(TritonConfig, InstanceCountIsSharedByTheWorkers) {
  const std::string group = "instance_group [ { count: 3 kind: KIND_CPU } ]";
  EXPECT_EQ(ReadTriton(group, 1).config.instance_placement().instances_per_domain(), 3);
  EXPECT_EQ(ReadTriton(group, 2).config.instance_placement().instances_per_domain(), 2);
  EXPECT_EQ(ReadTriton(group, 4).config.instance_placement().instances_per_domain(), 1);
  // Over the workers that hold the model.
  EXPECT_EQ(ReadTriton(group + " instance_placement { domains: [ 0 ] }", 4)
                .config.instance_placement()
                .instances_per_domain(),
            3);
  // Groups add up; a group without count is one copy; KIND_AUTO is the CPU.
  EXPECT_EQ(ReadTriton("instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_AUTO } ]")
                .config.instance_placement()
                .instances_per_domain(),
            3);
}

TEST(TritonConfig, NumaserveFieldsStayAvailable) {
  ModelConfigFile f = ReadTriton(
      "platform: \"onnxruntime_onnx\"\n"
      "instance_placement { domains: [ 1 ] instances_per_domain: per_core }\n"
      "gemm_backend: \"onednn\"\n"
      "precision: \"bf16\"\n"
      "max_activation_bytes: 4096\n");
  EXPECT_TRUE(f.triton);
  EXPECT_EQ(f.config.precision(), "bf16");
  EXPECT_EQ(f.config.max_activation_bytes(), 4096u);
  EXPECT_EQ(f.config.instance_placement().instances_per_domain(), kInstancesPerCore);
  EXPECT_EQ(f.config.instance_placement().domains_size(), 1);
  EXPECT_EQ(f.config.gemm_backend(), "onednn");
  EXPECT_TRUE(f.ignored_fields.empty());
  // Both counts at once are refused.
  auto both = ReadModelConfigText(
      "instance_group [ { count: 2 } ]\ninstance_placement { instances_per_domain: 2 }",
      "repo/mlp/config.pbtxt");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(std::string(both.status().message()),
              HasSubstr("repo/mlp/config.pbtxt:1:1: instance_group: give either"));
}

TEST(TritonConfig, IgnoredFieldsAreReportedOnceEach) {
  std::string text = kTritonConfig;
  const std::string delay = "max_queue_delay_microseconds: 100";
  text.replace(text.find(delay), delay.size(), delay + " preserve_ordering: true");
  ModelConfigFile f = ReadTriton(text +
                                 "input [ { name: \"other\" format: FORMAT_NCHW dims: [ 1 ] } ]\n"
                                 "instance_group [ { name: \"g\" count: 1 kind: KIND_CPU } ]\n");
  EXPECT_EQ(f.ignored_fields, (std::vector<std::string>{"input.format", "instance_group.name",
                                                        "dynamic_batching.preserve_ordering",
                                                        "optimization", "parameters"}));
  // default_model_filename "model.onnx" is what numaserve reads: used, not ignored.
  EXPECT_EQ(std::count(f.ignored_fields.begin(), f.ignored_fields.end(), "default_model_filename"),
            0);
}

TEST(TritonConfig, WhatNumaserveCannotHonourIsRefusedWithFileAndField) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"name: \"mlp\"\ninstance_group [ { count: 1 kind: KIND_GPU } ]",
       "repo/mlp/config.pbtxt:2:29: instance_group[0].kind: KIND_GPU: numaserve runs models on "
       "CPU workers only"},
      {"instance_group [ { kind: KIND_CPU },\n  { count: 1 gpus: [ 0 ] } ]",
       "repo/mlp/config.pbtxt:2:14: instance_group[1].gpus"},
      {"name: \"mlp\"\nplatform: \"tensorflow_savedmodel\"",
       "repo/mlp/config.pbtxt:2:1: platform: 'tensorflow_savedmodel': numaserve serves ONNX "
       "models only"},
      {"backend: \"python\"", "repo/mlp/config.pbtxt:1:1: backend: 'python'"},
      {"platform: \"onnxruntime_onnx\"\nsequence_batching { max_sequence_idle_microseconds: 5 }",
       "repo/mlp/config.pbtxt:2:1: sequence_batching"},
      {"default_model_filename: \"net.onnx\"", "default_model_filename: 'net.onnx'"},
      {"input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]",
       "repo/mlp/config.pbtxt:1:54: input 'x' reshape"},
      {"instance_group [ { count: -1 } ]", "instance_group[0].count: -1 is outside"},
  };
  for (const auto& c : cases) {
    auto f = ReadModelConfigText(c.text, "repo/mlp/config.pbtxt", 1);
    ASSERT_FALSE(f.ok()) << c.text;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.expect)) << c.text;
  }
}

TEST(TritonConfig, UnknownFieldsKeepLineAndColumn) {
  // Past Triton's fields: Triton's parse got further, its error is given.
  auto f = ReadModelConfigText(
      "platform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n  optimisation { graph { level: 1 } }\n",
      "repo/mlp/config.pbtxt");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("repo/mlp/config.pbtxt:3:16: "));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("optimisation"));
  // Inside a Triton block.
  f = ReadModelConfigText(
      "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }\n]\ninstance_group [ { count: 1 "
      "kind: KIND_CPU cores: 2 } ]",
      "repo/mlp/config.pbtxt");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("repo/mlp/config.pbtxt:3:49: "));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("cores"));
  // An unknown type name.
  f = ReadModelConfigText("input [ { name: \"x\" data_type: TYPE_FLOAT32 } ]", "c.pbtxt");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("c.pbtxt:1:45: "));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("TYPE_FLOAT32"));
  // A numaserve-only field beside a Triton-only one: numaserve's schema got further.
  f = ReadModelConfigText(
      "max_batch_size: 4\ndynamic_batching { max_queue_size: 3 }\nplatform: \"onnxruntime_onnx\"",
      "c.pbtxt");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("c.pbtxt:3:9: "));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("platform"));
}

TEST(ModelConfig, PriorityLevelsAreBoundedAndTheDefaultLiesWithinThem) {
  const std::string head = "max_batch_size: 8 dynamic_batching { ";
  EXPECT_TRUE(ValidateModelConfigFields(
                  Parse(head + "priority_levels: 3 default_priority_level: 2 }"), "mlp", 1)
                  .ok());
  EXPECT_TRUE(ValidateModelConfigFields(
                  Parse(head + "priority_levels: 1000 default_priority_level: 1000 }"), "mlp", 1)
                  .ok());
  struct Case {
    std::string text;
    const char* expect;
  } cases[] = {
      {head + "priority_levels: 1001 default_priority_level: 1 }",
       "dynamic_batching.priority_levels: 1001 is above the limit of 1000"},
      {head + "priority_levels: 3 }",
       "dynamic_batching.default_priority_level: 0 is outside 1..priority_levels (3)"},
      {head + "priority_levels: 3 default_priority_level: 4 }",
       "dynamic_batching.default_priority_level: 4 is outside 1..priority_levels (3)"},
      {head + "default_priority_level: 1 }",
       "dynamic_batching.default_priority_level: 1 is set without"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateModelConfigFields(Parse(c.text), "mlp", 1);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect)) << c.text;
  }
}

TEST(TritonConfig, PriorityLevelsAreRead) {
  ModelConfigFile f = ReadTriton(
      "max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 2 }");
  EXPECT_EQ(f.config.dynamic_batching().priority_levels(), 2u);
  EXPECT_EQ(f.config.dynamic_batching().default_priority_level(), 2u);
  f = ReadTriton(
      "platform: \"onnxruntime_onnx\" max_batch_size: 8 dynamic_batching { priority_levels: 2 "
      "default_priority_level: 1 }");
  EXPECT_TRUE(f.triton);
  EXPECT_EQ(f.config.dynamic_batching().priority_levels(), 2u);
  EXPECT_EQ(f.config.dynamic_batching().default_priority_level(), 1u);
  EXPECT_TRUE(f.ignored_fields.empty()) << absl::StrJoin(f.ignored_fields, ",");
}

TEST(ConfigJson, TritonsJsonAsTritonClientsSendIt) {
  auto f = ReadModelConfigJson(
      R"({"name": "mlp", "platform": "onnxruntime_onnx", "max_batch_size": 8,
          "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [784]}],
          "instance_group": [{"kind": "KIND_CPU", "count": 2}],
          "dynamic_batching": {"preferred_batch_size": [4], "priorityLevels": "2",
                               "default_priority_level": 1}})",
      "override", 2);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->triton);
  EXPECT_EQ(f->config.max_batch_size(), 8);
  EXPECT_EQ(f->config.input(0).data_type(), "FP32");
  EXPECT_EQ(f->config.instance_placement().instances_per_domain(), 1);
  EXPECT_EQ(f->config.dynamic_batching().priority_levels(), 2u);
  EXPECT_TRUE(ValidateModelConfig(f->config, "mlp", Mlp(), 2).ok());
}

TEST(ConfigJson, NumaserveSchemaReadsToo) {
  auto f = ReadModelConfigJson(R"({"max_batch_size": 4, "gemm_backend": "onednn",
                                   "instance_placement": {"instances_per_domain": 2}})",
                               "override");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->triton);
  EXPECT_EQ(f->config.max_batch_size(), 4);
  EXPECT_EQ(f->config.instance_placement().instances_per_domain(), 2);
  EXPECT_TRUE(ReadModelConfigJson("{}", "override").ok());
}

TEST(ConfigJson, BadOverridesAreRefusedNamingTheProblem) {
  struct Case {
    std::string json;
    const char* expect;
  } cases[] = {
      {"{", "override: "},
      {"[1]", "override: "},
      {R"({"max_batch_size": "many"})", "max_batch_size"},
      {R"({"no_such_field": 1})", "no_such_field"},
      {R"({"platform": "onnxruntime_onnx", "input": [{"name": "x", "data_type": "TYPE_NOPE"}]})",
       "data_type"},
      {R"({"sequence_batching": {}})", "sequence_batching"},
      {R"({"instance_placement": {"instances_per_domain": -1}})",
       "instance_placement.instances_per_domain"},
      {std::string(kMaxConfigJsonBytes + 1, ' '), "above the limit"},
      {std::string(200000, '['), "override: "},
  };
  for (const Case& c : cases) {
    auto f = ReadModelConfigJson(c.json, "override");
    ASSERT_FALSE(f.ok()) << c.json.substr(0, 80);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.expect)) << c.json.substr(0, 80);
  }
}

// model_warmup, in Triton's schema and numaserve's, checked against the model.
TEST(TritonConfig, ModelWarmupIsConvertedAndChecked) {
  ModelConfigFile f = ReadTriton(kTritonConfig);
  ASSERT_EQ(f.config.model_warmup_size(), 1);
  const config::ModelWarmup& w = f.config.model_warmup(0);
  EXPECT_EQ(w.name(), "w");
  EXPECT_EQ(w.batch_size(), 1u);
  ASSERT_EQ(w.inputs().count("input"), 1u);
  EXPECT_EQ(w.inputs().at("input").data_type(), "FP32");
  EXPECT_TRUE(w.inputs().at("input").zero_data());
  auto shapes = WarmupInputShapes(f.config, 0, "mlp", Mlp());
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(*shapes, (std::vector<std::vector<int64_t>>{{1, 784}}));

  std::string file = kTritonConfig;
  const std::string zero = "zero_data: true";
  file.replace(file.find(zero), zero.size(), "input_data_file: \"raw\"");
  auto refused = ReadModelConfigText(file, "repo/mlp/config.pbtxt", 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model_warmup.inputs['input'].input_data_file: numaserve warms up with "
                        "zero_data or random_data only"));
}

TEST(ModelConfig, MalformedWarmupsAreRefusedNamingTheEntryAndField) {
  auto refusal = [](const std::string& warmup) {
    config::ModelConfig c = Parse("max_batch_size: 8 model_warmup { name: \"w\" " + warmup + " }");
    absl::Status s = ValidateModelConfig(c, "mlp", Mlp(), 1);
    return s.ok() ? std::string("accepted") : std::string(s.message());
  };
  const std::string input = "inputs { key: \"input\" value: { data_type: \"FP32\" ";
  EXPECT_EQ(refusal("batch_size: 2 " + input + "dims: [784] random_data: true } }"), "accepted");
  EXPECT_THAT(refusal("batch_size: 9 " + input + "dims: [784] zero_data: true } }"),
              HasSubstr("model_warmup[0] ('w'): batch_size 9 is outside 1..8"));
  EXPECT_THAT(refusal("batch_size: 1 " + input + "dims: [783] zero_data: true } }"),
              HasSubstr("input 'input' dim 1 is 783 but the model has 784"));
  EXPECT_THAT(refusal("batch_size: 1 " + input + "dims: [784] } }"),
              HasSubstr("exactly one of zero_data and random_data"));
  EXPECT_THAT(refusal("batch_size: 1 inputs { key: \"x\" value: { zero_data: true } }"),
              HasSubstr("the model has no input 'x'"));
  EXPECT_THAT(refusal("batch_size: 1"), HasSubstr("input 'input' is missing"));
  EXPECT_THAT(refusal("batch_size: 1 count: 1001 " + input + "dims: [784] zero_data: true } }"),
              HasSubstr("count 1001 is above 1000"));
  EXPECT_THAT(refusal("batch_size: 1 inputs { key: \"input\" value: { data_type: \"INT64\" "
                      "dims: [784] zero_data: true } }"),
              HasSubstr("data_type 'INT64' but the model's input is FP32"));
}

}  // namespace
}  // namespace numaserve::serving
