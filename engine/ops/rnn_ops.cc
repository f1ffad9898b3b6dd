// Op table rows for the recurrent layers LSTM and GRU (opsets 7 to 22), as
// PyTorch's nn.LSTM / nn.GRU export them: forward, reverse or
// bidirectional, `layout` 0 ([seq, batch, ...]; layout 1 is refused at
// load, as ONNX Runtime refuses it, and exporters transpose to layout 0),
// optional bias, initial states, peepholes (LSTM), `clip`,
// `input_forget` (LSTM), `linear_before_reset` (GRU) and constant
// `sequence_lens` (steps past a sequence's length write zeros to Y and
// leave its state as it was). Activations Sigmoid, Tanh and Relu (the
// defaults are Sigmoid, Tanh, Tanh); others, and activation_alpha/beta,
// are refused at load naming the node. The reference runs each step's
// products in double; a runtime sequence_lens is refused at load.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// The most multiply-adds the reference does for one node (a layer that
// needs more, at load or for the request that asks it, is refused rather
// than left to run for minutes; the same bound as Einsum's: an LSTM of 512
// units (input 512) over 256 steps at batch 16 is 8.6e9).
constexpr double kMaxRnnWork = 1e10;

enum class Activation { kSigmoid, kTanh, kRelu };

double Apply(Activation a, double x) {
  switch (a) {
    case Activation::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kRelu:
      return x > 0 ? x : 0.0;
  }
  return x;
}

bool IsLstm(const Node& node) { return node.op_type == "LSTM"; }

// Gates per direction: LSTM's i, o, f, c; GRU's z, r, h.
int64_t Gates(const Node& node) { return IsLstm(node) ? 4 : 3; }

int64_t Directions(const Node& node) {
  return node.GetString("direction", "forward") == "bidirectional" ? 2 : 1;
}

// The activations per direction (f, g[, h]), the defaults filled in.
absl::StatusOr<std::vector<Activation>> ActivationsOf(const Node& node) {
  const size_t per_direction = IsLstm(node) ? 3 : 2;
  std::vector<std::string> names;
  // The importer keeps a list of strings comma-joined; an empty list is
  // the defaults.
  if (const std::string joined = node.GetString("activations", ""); !joined.empty()) {
    names = absl::StrSplit(joined, ',');
  }
  if (names.empty()) {
    names = IsLstm(node) ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                         : std::vector<std::string>{"Sigmoid", "Tanh"};
    if (Directions(node) == 2) {
      const std::vector<std::string> one = names;
      names.insert(names.end(), one.begin(), one.end());
    }
  }
  if (names.size() != per_direction * Directions(node)) {
    return NodeError(node, absl::StrCat("activations lists ", names.size(), " functions; ",
                                        per_direction * Directions(node), " are needed"));
  }
  std::vector<Activation> out;
  for (const std::string& name : names) {
    if (name == "Sigmoid") {
      out.push_back(Activation::kSigmoid);
    } else if (name == "Tanh") {
      out.push_back(Activation::kTanh);
    } else if (name == "Relu") {
      out.push_back(Activation::kRelu);
    } else {
      return NodeUnsupported(
          node, absl::StrCat("activation '", name, "' (supported: Sigmoid, Tanh, Relu)"));
    }
  }
  return out;
}

absl::Status RnnValidate(const Graph& graph, const Node& node) {
  // X, W, R, B, sequence_lens, initial_h[, initial_c, P]; Y, Y_h[, Y_c].
  if (absl::Status s = CheckArity(node, 3, IsLstm(node) ? 8 : 6, 0, IsLstm(node) ? 3 : 2);
      !s.ok()) {
    return s;
  }
  const std::string direction = node.GetString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    return NodeError(node, absl::StrCat("direction '", direction, "'"));
  }
  if (node.GetInt("layout", 0) != 0) {
    return NodeUnsupported(node, "layout 1 ([batch, seq, ...]; transpose to layout 0)");
  }
  if (node.HasAttribute("activation_alpha") || node.HasAttribute("activation_beta")) {
    return NodeUnsupported(node, "activation_alpha / activation_beta");
  }
  if (node.HasAttribute("clip") && !(node.GetFloat("clip", 0) > 0)) {
    return NodeError(node, "clip must be positive");
  }
  if (HasInput(node, 4) && !graph.IsConstant(node.inputs[4])) {
    return NodeUnsupported(node, "sequence_lens given at run time (a constant is supported)");
  }
  return ActivationsOf(node).status();
}

// Dims of a layer: sequence length, batch, input size, hidden size.
struct RnnDims {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, directions = 1;
};

absl::StatusOr<RnnDims> DimsOf(const Node& node, const std::vector<const Shape*>& in) {
  RnnDims d;
  d.directions = Directions(node);
  const Shape& x = *in[0];
  const Shape& w = *in[1];
  const Shape& r = *in[2];
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) {
    return NodeError(node, "X, W and R must be 3-D");
  }
  d.seq = x[0];
  d.batch = x[1];
  d.input = x[2];
  d.hidden = r[2];
  const int64_t gates = Gates(node) * d.hidden;
  if (node.HasAttribute("hidden_size") && node.GetInt("hidden_size", 0) != d.hidden) {
    return NodeError(node, absl::StrCat("hidden_size ", node.GetInt("hidden_size", 0),
                                        " differs from R's last dim ", d.hidden));
  }
  auto expect = [&](size_t i, const Shape& want, const char* what) -> absl::Status {
    if (i >= in.size() || in[i] == nullptr || *in[i] == want) return absl::OkStatus();
    return NodeError(node, absl::StrCat(what, " is ", kernels::ShapeToString(*in[i]), ", expected ",
                                        kernels::ShapeToString(want)));
  };
  const Shape state{d.directions, d.batch, d.hidden};
  for (absl::Status s :
       {expect(1, {d.directions, gates, d.input}, "W"),
        expect(2, {d.directions, gates, d.hidden}, "R"), expect(3, {d.directions, 2 * gates}, "B"),
        expect(4, {d.batch}, "sequence_lens"), expect(5, state, "initial_h"),
        expect(6, state, "initial_c"), expect(7, {d.directions, 3 * d.hidden}, "P")}) {
    if (!s.ok()) return s;
  }
  return d;
}

double RnnFlops(const Node& node, const std::vector<const Shape*>& in);

ShapesOr RnnShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto d = DimsOf(node, in);
  if (!d.ok()) return d.status();
  if (const double work = RnnFlops(node, in) / 2; work > kMaxRnnWork) {
    return NodeUnsupported(
        node, absl::StrCat("the layer takes ", work, " multiply-adds, more than the reference's ",
                           kMaxRnnWork));
  }
  const Shape y{d->seq, d->directions, d->batch, d->hidden};
  const Shape state{d->directions, d->batch, d->hidden};
  std::vector<Shape> out = {y, state};
  if (IsLstm(node)) out.push_back(state);
  out.resize(node.outputs.size());
  for (const Shape& s : out) {
    if (absl::Status st = CheckShape(node, s, "an output"); !st.ok()) return st;
  }
  return out;
}

double RnnFlops(const Node& node, const std::vector<const Shape*>& in) {
  auto d = DimsOf(node, in);
  if (!d.ok()) return 0.0;
  return 2.0 * static_cast<double>(d->seq * d->batch * d->directions * Gates(node) * d->hidden) *
         static_cast<double>(d->input + d->hidden);
}

// What one direction's steps read: that direction's slices of the weights.
struct Direction {
  const float* w;   // [gates * hidden, input]
  const float* r;   // [gates * hidden, hidden]
  const float* wb;  // [gates * hidden] or null
  const float* rb;  // [gates * hidden] or null
  const float* p;   // LSTM peepholes [3 * hidden] (i, o, f) or null
  std::vector<Activation> act;
  bool reverse = false;
};

// A gate's pre-activation clipped to [-clip, clip] (no clip: 0).
double Clipped(double v, double clip) { return clip > 0 ? std::clamp(v, -clip, clip) : v; }

// row . vector over n elements, in double.
double Dot(const float* row, const double* v, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += static_cast<double>(row[k]) * v[k];
  return s;
}

// Runs one direction of one sequence (batch row b), writing Y and the
// final states through the callbacks' indexing.
struct Sequence {
  const RnnDims& d;
  const Node& node;
  const Tensor& x;
  int64_t b, dir, length;
  double clip;
};

template <typename YAt>
void RunLstm(const Sequence& s, const Direction& w, std::vector<double>& h, std::vector<double>& c,
             YAt y_at) {
  const int64_t H = s.d.hidden, I = s.d.input;
  const bool input_forget = s.node.GetInt("input_forget", 0) != 0;
  std::vector<double> xt(I), pre(4 * H);
  for (int64_t step = 0; step < s.length; ++step) {
    const int64_t t = w.reverse ? s.length - 1 - step : step;
    for (int64_t k = 0; k < I; ++k) {
      xt[k] = s.x.data[(t * s.d.batch + s.b) * I + k];
    }
    for (int64_t g = 0; g < 4 * H; ++g) {
      double v = Dot(w.w + g * I, xt.data(), I) + Dot(w.r + g * H, h.data(), H);
      if (w.wb != nullptr) v += static_cast<double>(w.wb[g]) + w.rb[g];
      pre[g] = v;
    }
    for (int64_t j = 0; j < H; ++j) {
      // Gate order in W, R and B: i, o, f, c; in P: i, o, f.
      double i = pre[j], o = pre[H + j], f = pre[2 * H + j];
      const double cc = Apply(w.act[1], Clipped(pre[3 * H + j], s.clip));
      if (w.p != nullptr) {
        i += w.p[j] * c[j];
        f += w.p[2 * H + j] * c[j];
      }
      i = Apply(w.act[0], Clipped(i, s.clip));
      f = input_forget ? 1.0 - i : Apply(w.act[0], Clipped(f, s.clip));
      c[j] = f * c[j] + i * cc;
      if (w.p != nullptr) o += w.p[H + j] * c[j];
      o = Apply(w.act[0], Clipped(o, s.clip));
      h[j] = o * Apply(w.act[2], c[j]);
    }
    for (int64_t j = 0; j < H; ++j) *y_at(t, j) = static_cast<float>(h[j]);
  }
}

template <typename YAt>
void RunGru(const Sequence& s, const Direction& w, std::vector<double>& h, YAt y_at) {
  const int64_t H = s.d.hidden, I = s.d.input;
  const bool linear_before_reset = s.node.GetInt("linear_before_reset", 0) != 0;
  std::vector<double> xt(I), wx(3 * H), rh(3 * H), gated(H);
  for (int64_t step = 0; step < s.length; ++step) {
    const int64_t t = w.reverse ? s.length - 1 - step : step;
    for (int64_t k = 0; k < I; ++k) {
      xt[k] = s.x.data[(t * s.d.batch + s.b) * I + k];
    }
    // Gate order in W, R and B: z, r, h.
    for (int64_t g = 0; g < 3 * H; ++g) {
      wx[g] = Dot(w.w + g * I, xt.data(), I) + (w.wb != nullptr ? w.wb[g] : 0.0f);
      rh[g] = Dot(w.r + g * H, h.data(), H) + (w.rb != nullptr ? w.rb[g] : 0.0f);
    }
    std::vector<double> z(H), r(H);
    for (int64_t j = 0; j < H; ++j) {
      z[j] = Apply(w.act[0], Clipped(wx[j] + rh[j], s.clip));
      r[j] = Apply(w.act[0], Clipped(wx[H + j] + rh[H + j], s.clip));
      gated[j] = r[j] * h[j];
    }
    for (int64_t j = 0; j < H; ++j) {
      double candidate;
      if (linear_before_reset) {
        candidate = wx[2 * H + j] + r[j] * rh[2 * H + j];
      } else {
        candidate = wx[2 * H + j] + Dot(w.r + (2 * H + j) * H, gated.data(), H) +
                    (w.rb != nullptr ? w.rb[2 * H + j] : 0.0f);
      }
      const double hh = Apply(w.act[1], Clipped(candidate, s.clip));
      h[j] = (1.0 - z[j]) * hh + z[j] * h[j];
    }
    for (int64_t j = 0; j < H; ++j) *y_at(t, j) = static_cast<float>(h[j]);
  }
}

TensorsOr RnnReference(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in) {
  std::vector<const Shape*> shapes;
  for (const Tensor* t : in) shapes.push_back(t != nullptr ? &t->shape : nullptr);
  auto out_shapes = RnnShapes(graph, node, shapes);
  if (!out_shapes.ok()) return out_shapes.status();
  auto d = DimsOf(node, shapes);
  if (!d.ok()) return d.status();
  auto activations = ActivationsOf(node);
  if (!activations.ok()) return activations.status();
  std::vector<int64_t> lengths(d->batch, d->seq);
  if (HasInput(node, 4)) {
    auto given = ConstInts(graph, node, 4, "sequence_lens");
    if (!given.ok()) return given.status();
    const std::optional<std::vector<int64_t>>& values = *given;
    if (values.has_value() && static_cast<int64_t>(values->size()) != d->batch) {
      return NodeError(node, "sequence_lens must hold one length per sequence");
    }
    for (int64_t b = 0; b < d->batch; ++b) {
      const int64_t n = values.has_value() ? (*values)[b] : d->seq;
      if (n < 0 || n > d->seq) {
        return NodeError(
            node, absl::StrCat("sequence_lens[", b, "] is ", n, ", outside [0, ", d->seq, "]"));
      }
      lengths[b] = n;
    }
  }
  const bool lstm = IsLstm(node);
  const int64_t H = d->hidden, G = Gates(node) * H, D = d->directions;
  std::vector<Tensor> out;
  // Y holds zeros past each sequence's end.
  Tensor y(Shape{d->seq, D, d->batch, H}), y_h(Shape{D, d->batch, H}), y_c(Shape{D, d->batch, H});
  auto state_index = [&](int64_t dir, int64_t b, int64_t j) {
    return (dir * d->batch + b) * H + j;
  };
  const double clip = node.HasAttribute("clip") ? node.GetFloat("clip", 0) : 0.0;
  const size_t per_direction = lstm ? 3 : 2;
  for (int64_t dir = 0; dir < D; ++dir) {
    Direction w;
    w.w = in[1]->data.data() + dir * G * d->input;
    w.r = in[2]->data.data() + dir * G * H;
    const bool bias = in.size() > 3 && in[3] != nullptr;
    w.wb = bias ? in[3]->data.data() + dir * 2 * G : nullptr;
    w.rb = bias ? w.wb + G : nullptr;
    w.p = lstm && in.size() > 7 && in[7] != nullptr ? in[7]->data.data() + dir * 3 * H : nullptr;
    w.act.assign(activations->begin() + dir * per_direction,
                 activations->begin() + (dir + 1) * per_direction);
    w.reverse = node.GetString("direction", "forward") == "reverse" || dir == 1;
    for (int64_t b = 0; b < d->batch; ++b) {
      std::vector<double> h(H, 0.0), c(H, 0.0);
      for (int64_t j = 0; j < H; ++j) {
        if (in.size() > 5 && in[5] != nullptr) h[j] = in[5]->data[state_index(dir, b, j)];
        if (lstm && in.size() > 6 && in[6] != nullptr) c[j] = in[6]->data[state_index(dir, b, j)];
      }
      const Sequence s{*d, node, *in[0], b, dir, lengths[b], clip};
      auto y_at = [&](int64_t t, int64_t j) {
        return y.data.data() + ((t * D + dir) * d->batch + b) * H + j;
      };
      if (lstm) {
        RunLstm(s, w, h, c, y_at);
      } else {
        RunGru(s, w, h, y_at);
      }
      for (int64_t j = 0; j < H; ++j) {
        y_h.data[state_index(dir, b, j)] = static_cast<float>(h[j]);
        y_c.data[state_index(dir, b, j)] = static_cast<float>(c[j]);
      }
    }
  }
  out.push_back(std::move(y));
  out.push_back(std::move(y_h));
  if (lstm) out.push_back(std::move(y_c));
  out.resize(node.outputs.size());
  return out;
}

}  // namespace

void AddRnnOps(std::vector<OpSchema>& table) {
  table.push_back({"LSTM", RnnValidate, RnnShapes, RnnReference, RnnFlops});
  table.push_back({"GRU", RnnValidate, RnnShapes, RnnReference, RnnFlops});
}

}  // namespace numaserve::engine::ops
