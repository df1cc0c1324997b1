// Adapters of the permute family: generic call -> C ABI. Input and output order and attribute
// names follow core/ops/permute.py (the one description both frontends use). Every op reads the
// int64 attributes map_type, num_tokens, num_slots and num_out_tokens; an optional input is
// present when the call passes it.
#include "ops/registry.h"
#include "twinengine/permute.h"

namespace twe {
namespace ops {
namespace {

TwePermuteParams permute_params(const Attrs& attrs) {
  TwePermuteParams p{};
  p.map_type = static_cast<TweMapType>(attrs.get_int("map_type"));
  p.num_tokens = attrs.get_int("num_tokens");
  p.num_slots = attrs.get_int("num_slots");
  p.num_out_tokens = attrs.get_int("num_out_tokens");
  return p;
}

/*! Input i if the call passed it, else an absent view. */
TweTensorView optional_input(OpCall& call, size_t i) {
  return i < call.inputs.size() ? call.inputs[i] : TweTensorView{};
}

/*! The next output if optional input i was passed (its partner output), else an absent view. */
TweTensorView optional_output(OpCall& call, size_t i) {
  return i < call.inputs.size() ? call.take_output() : TweTensorView{};
}

using RowIdMapBuilder = TweStatus (*)(const TweTensorView*, TweTensorView*, TweTensorView*, const TwePermuteParams*,
                                       void*);

// inputs: routing_map | outputs: row_id_map, workspace
template <RowIdMapBuilder Build>
TweStatus permute_row_id_map(OpCall& call) {
  TweTensorView map = call.take_output();
  TweTensorView workspace = call.take_output();
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return Build(call.input(0), &map, &workspace, &p, call.stream);
}

// inputs: split_sizes, sorted_index | outputs: row_id_map
TweStatus permute_chunk_map(OpCall& call) {
  TweTensorView map = call.take_output();
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_chunk_map(call.input(0), call.input(1), &map, &p, call.stream);
}

// inputs: inp, row_id_map[, probs] | outputs: out[, permuted_probs]
TweStatus permute_rows(OpCall& call) {
  TweTensorView probs = optional_input(call, 2);
  TweTensorView out = call.take_output();
  TweTensorView permuted_probs = optional_output(call, 2);
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_rows(call.input(0), call.input(1), &probs, &out, &permuted_probs, &p, call.stream);
}

// inputs: grad_out, row_id_map[, grad_permuted_probs] | outputs: grad_inp[, grad_probs]
TweStatus permute_rows_backward(OpCall& call) {
  TweTensorView grad_pp = optional_input(call, 2);
  TweTensorView grad_inp = call.take_output();
  TweTensorView grad_probs = optional_output(call, 2);
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_rows_backward(call.input(0), &grad_pp, call.input(1), &grad_inp, &grad_probs, &p, call.stream);
}

// inputs: y, row_id_map[, merging_probs] | outputs: out
TweStatus permute_unpermute(OpCall& call) {
  TweTensorView probs = optional_input(call, 2);
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_unpermute(call.input(0), call.input(1), &probs, &out, &p, call.stream);
}

// inputs: grad_out, y, row_id_map[, merging_probs] | outputs: grad_y[, grad_merging_probs]
TweStatus permute_unpermute_backward(OpCall& call) {
  TweTensorView probs = optional_input(call, 3);
  TweTensorView grad_y = call.take_output();
  TweTensorView grad_probs = optional_output(call, 3);
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_unpermute_backward(call.input(0), call.input(1), call.input(2), &probs, &grad_y, &grad_probs, &p,
                                        call.stream);
}

// inputs: counts | outputs: pad_offsets, padded_counts | attrs: align_size
TweStatus permute_pad_offsets(OpCall& call) {
  TweTensorView offsets = call.take_output();
  TweTensorView padded = call.take_output();
  call.expect_all_outputs_taken();
  return twe_permute_pad_offsets(call.input(0), &offsets, &padded, call.attrs->get_int("align_size"), call.stream);
}

// inputs: row_id_map, pad_offsets | outputs: padded row_id_map
TweStatus permute_pad_map(OpCall& call) {
  TweTensorView out = call.take_output();
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_pad_map(call.input(0), call.input(1), &out, &p, call.stream);
}

// inputs: split_sizes, pad_offsets | outputs: row_id_map
TweStatus permute_split_pad_map(OpCall& call) {
  TweTensorView map = call.take_output();
  call.expect_all_outputs_taken();
  TwePermuteParams p = permute_params(*call.attrs);
  return twe_permute_split_pad_map(call.input(0), call.input(1), &map, &p, call.stream);
}

}  // namespace

TWE_REGISTER_OP(permute_pad_offsets, permute_pad_offsets);
TWE_REGISTER_OP(permute_pad_map, permute_pad_map);
TWE_REGISTER_OP(permute_split_pad_map, permute_split_pad_map);
TWE_REGISTER_OP(permute_row_id_map_index, permute_row_id_map<twe_permute_row_id_map_index>);
TWE_REGISTER_OP(permute_row_id_map_mask, permute_row_id_map<twe_permute_row_id_map_mask>);
TWE_REGISTER_OP(permute_chunk_map, permute_chunk_map);
TWE_REGISTER_OP(permute_rows, permute_rows);
TWE_REGISTER_OP(permute_rows_backward, permute_rows_backward);
TWE_REGISTER_OP(permute_unpermute, permute_unpermute);
TWE_REGISTER_OP(permute_unpermute_backward, permute_unpermute_backward);

}  // namespace ops
}  // namespace twe
