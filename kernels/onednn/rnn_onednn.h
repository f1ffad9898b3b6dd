// ONNX LSTM and GRU (layout 0: X [seq, batch, input]) on oneDNN's RNN
// primitives: lstm_forward (with peepholes where the node has them),
// gru_forward for GRU with linear_before_reset 0 and lbr_gru_forward for
// linear_before_reset 1 (what torch.onnx.export writes). Each cell's
// formula is ONNX's exactly with the default activations (Sigmoid, Tanh,
// Tanh), no clip and no input_forget; the caller keeps every other form on
// the reference.
//
// ONNX orders the gates i, o, f, c (LSTM; peepholes i, o, f) and z, r, h
// (GRU); oneDNN i, f, c~, o (peepholes i, f, o) and u, r, o. The weights
// are reordered once, at Create, into oneDNN's plain ldigo / ldgo layouts
// in its gate order, with the two ONNX biases summed (lbr_gru keeps R's
// bias of the candidate gate apart, as its fourth bias gate). One
// primitive per (seq, batch) (the kShapeCacheCapacity most recently run
// kept), the weights reordered into the layout it asks for once per
// layout, shared between shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

enum class RnnCell { kLstm, kGru, kLbrGru };
enum class RnnDirection { kForward, kReverse, kBidirectional };

// "lstm", "gru", "lbr_gru"; "forward", "reverse", "bidirectional".
const char* RnnCellName(RnnCell cell);
const char* RnnDirectionName(RnnDirection direction);

// One layer's constant parameters, in ONNX's layouts and gate order.
struct RnnParams {
  RnnCell cell = RnnCell::kLstm;
  RnnDirection direction = RnnDirection::kForward;
  int64_t input = 0, hidden = 0;
  std::vector<float> w;  // W [D, G * hidden, input]
  std::vector<float> r;  // R [D, G * hidden, hidden]
  std::vector<float> b;  // B [D, 2 * G * hidden] (Wb then Rb), or empty: zeros
  std::vector<float> p;  // LSTM's P [D, 3 * hidden], or empty: none
  // Whether the node reads initial_h / initial_c (LSTM) at all.
  bool has_initial_h = false, has_initial_c = false;
};

// One run's buffers; y is always written, the others may be null.
struct RnnBuffers {
  const float* x = nullptr;   // [seq, batch, input]
  const float* h0 = nullptr;  // [D, batch, hidden] (null: zeros)
  const float* c0 = nullptr;  // [D, batch, hidden] (LSTM; null: zeros)
  float* y = nullptr;         // [seq, D, batch, hidden]
  float* y_h = nullptr;       // [D, batch, hidden]
  float* y_c = nullptr;       // [D, batch, hidden] (LSTM)
};

class RnnOnednn {
 public:
  // InvalidArgument when the parameters' sizes do not fit their dims.
  static absl::StatusOr<std::unique_ptr<RnnOnednn>> Create(const dnnl::engine& engine,
                                                           const RnnParams& params);

  // seq and batch at least 1 (the caller runs empty ones elsewhere).
  absl::Status Execute(dnnl::stream& stream, int64_t seq, int64_t batch, const RnnBuffers& io);
  // oneDNN's implementation at (seq, batch) ("" before its first run there).
  std::string ImplementationName(int64_t seq, int64_t batch) const;
  // Creates the primitive for (seq, batch) (kept, as a run would) and
  // returns oneDNN's implementation of it: the caller's check, at compile
  // time, that oneDNN has more than its reference RNN for the cell.
  absl::StatusOr<std::string> Probe(int64_t seq, int64_t batch);
  // (seq, batch) pairs whose primitive is kept.
  size_t cached_shapes() const { return per_shape_.size(); }
  // Weight layouts prepared (a oneDNN layout per distinct choice of it).
  size_t prepared_weight_layouts() const { return prepared_.size(); }
  RnnCell cell() const { return cell_; }
  RnnDirection direction() const { return direction_; }

 private:
  RnnOnednn(const dnnl::engine& engine, const RnnParams& params);
  struct PerShape {
    BoundPrimitive call;
    std::string impl;
  };
  absl::StatusOr<PerShape*> Prepare(int64_t seq, int64_t batch);
  // `plain` (ldigo) reordered into `want` once; the same memory after.
  dnnl::memory PreparedWeights(const dnnl::memory& plain, const dnnl::memory::desc& want,
                               dnnl::stream& stream);

  dnnl::engine engine_;
  RnnCell cell_;
  RnnDirection direction_;
  int64_t directions_, gates_, input_, hidden_;
  bool has_initial_h_, has_initial_c_, peepholes_;
  // In oneDNN's gate order and plain layouts.
  dnnl::memory weights_layer_, weights_iter_, bias_, peephole_;
  std::vector<float> weights_layer_data_, weights_iter_data_, bias_data_, peephole_data_;
  // Weights reordered into a primitive's layout, by their plain source.
  struct PreparedWeightsEntry {
    const void* source;
    dnnl::memory::desc desc;
    dnnl::memory prepared;
  };
  std::vector<PreparedWeightsEntry> prepared_;
  // Zeros for a missing initial state beside a given one (LSTM), a
  // bidirectional layer's [seq, batch, 2 * hidden] output before it is
  // laid out as ONNX's Y, and the final states nobody reads.
  std::vector<float> zeros_, concat_, unread_h_, unread_c_;
  BoundedCache<std::tuple<int64_t, int64_t>, PerShape> per_shape_{kShapeCacheCapacity};
};

}  // namespace numaserve::kernels
