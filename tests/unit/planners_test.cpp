// The kernels' planners, apart from the kernels that run them: the
// flash route's calls (kernels/flash_plan.h) and the loss's chunking
// (kernels/loss_plan.h). Each expected plan is worked out
// by hand in the comment above it, from the mask's definition and the block
// size (128), or from the budget's formula; none is read back from the code.
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "flash_plan.h"
#include "loss_plan.h"

namespace keel::kernels {
namespace {

// A group as one comparable line: which rows and keys, how many, and how.
std::string describe(const FlashGroup& g) {
  std::ostringstream s;
  s << "b" << g.b0 << "+" << g.nb << " x" << g.count << " q[" << g.q0 << " step " << g.q_step
    << " rows " << g.rows << "] k[" << g.k0 << " step " << g.k_step << " len " << g.len << "]"
    << (g.causal ? " causal" : "") << (g.mask.defined() ? " masked" : "")
    << (g.merge ? " merge" : "");
  return s.str();
}

std::vector<std::string> plan(const AttentionSpec& spec, MaskGeometry geometry) {
  std::vector<std::string> out;
  for (const FlashGroup& g : plan_flash_groups(spec, geometry, at::kFloat)) {
    out.push_back(describe(g));
  }
  return out;
}

AttentionSpec with(std::vector<Mask> masks) {
  AttentionSpec spec;
  spec.masks = std::move(masks);
  return spec;
}

// Two documents of 256 tokens in a sequence of 512, for batch 1.
at::Tensor two_documents() {
  return at::cat({at::zeros({1, 256}, at::kLong), at::ones({1, 256}, at::kLong)}, 1);
}

using Plan = std::vector<std::string>;

// No mask: every query block sees every key, unmasked, so the query blocks
// share one call over all 512 rows and keys.
TEST(FlashPlan, NoMaskIsOneCall) {
  EXPECT_EQ(plan(AttentionSpec{}, {2, 4, 512, 512}),
            Plan{"b0+2 x1 q[0 step 512 rows 512] k[0 step 512 len 512]"});
}

// Top-left causal: one call with the kernel's causal flag, for every batch.
TEST(FlashPlan, TopLeftCausalIsOneCausalCall) {
  EXPECT_EQ(plan(with({Mask::causal()}), {3, 4, 512, 512}),
            Plan{"b0+3 x1 q[0 step 512 rows 512] k[0 step 512 len 512] causal"});
}

// Bottom-right causal with Lq == Lk is the same mask: simplified to it.
TEST(FlashPlan, BottomRightCausalOfEqualLengthsIsTopLeft) {
  EXPECT_EQ(plan(with({Mask::causal(CausalAlignment::bottom_right)}), {1, 2, 512, 512}),
            Plan{"b0+1 x1 q[0 step 512 rows 512] k[0 step 512 len 512] causal"});
}

// A window of 128 keys to the left over 1024 tokens: query block 0 sees its
// own diagonal block (keys [0, 128), masked); each later block qb sees key
// blocks qb - 1 (partial: row r sees keys from 128 (qb - 1) + r) and qb (the
// diagonal), 256 keys starting 128 before its first row. Those seven calls
// have the same mask (it depends on j - p only) and even spacing: one
// batched call of seven.
TEST(FlashPlan, SlidingWindowBatchesEvenlySpacedBlocks) {
  EXPECT_EQ(plan(with({Mask::sliding_window(128, 0)}), {1, 4, 1024, 1024}),
            (Plan{"b0+1 x1 q[0 step 128 rows 128] k[0 step 128 len 128] masked",
                  "b0+1 x7 q[128 step 128 rows 128] k[0 step 128 len 256] masked"}));
}

// Documents alone: each query block sees its document's two key blocks
// whole. Blocks 0-1 and 2-3 share their ranges, so each document is one
// unmasked piece of 256 rows, and the two pieces, evenly spaced, one call.
TEST(FlashPlan, DocumentsAreOneBatchedUnmaskedCall) {
  EXPECT_EQ(plan(with({Mask::document(two_documents(), two_documents())}), {1, 4, 512, 512}),
            Plan{"b0+1 x2 q[0 step 256 rows 256] k[0 step 256 len 256]"});
}

// Documents and causal: every query block's diagonal block is exactly
// causal, so the four diagonals are cut off into one batched causal call
// that merges last; the second block of each document also sees the
// document's first key block unmasked (query blocks 1 and 3, keys [0, 128)
// and [256, 384)): one batched call of two, run first.
TEST(FlashPlan, CausalDocumentsCutTheDiagonals) {
  EXPECT_EQ(plan(with({Mask::document(two_documents(), two_documents()), Mask::causal()}),
                 {1, 4, 512, 512}),
            (Plan{"b0+1 x2 q[128 step 256 rows 128] k[0 step 256 len 128]",
                  "b0+1 x4 q[0 step 128 rows 128] k[0 step 128 len 128] causal merge"}));
}

// Key padding depends on the batch, so each batch is planned alone. Batch 0
// (length 512) sees every key: one call. Batch 1 (length 200) sees key
// block 0 whole and block 1 in part from every query block: four calls of
// the same masked range of 256 keys, spaced 128 rows apart and 0 keys.
TEST(FlashPlan, KeyPaddingPlansEachBatch) {
  const at::Tensor lengths = at::tensor(std::vector<std::int64_t>{512, 200});
  EXPECT_EQ(plan(with({Mask::key_padding(lengths)}), {2, 4, 512, 512}),
            (Plan{"b0+1 x1 q[0 step 512 rows 512] k[0 step 512 len 512]",
                  "b1+1 x4 q[0 step 128 rows 128] k[0 step 0 len 256] masked"}));
}

TEST(FlashPlan, BlockSizesComeFromTheFirstBlockMask) {
  EXPECT_EQ(block_sizes(AttentionSpec{}), (std::pair<std::int64_t, std::int64_t>{128, 128}));
  BlockMask block;
  block.q_block_size = 64;
  block.kv_block_size = 32;
  EXPECT_EQ(block_sizes(with({Mask::causal(), Mask::block_mask(block)})),
            (std::pair<std::int64_t, std::int64_t>{64, 32}));
}

// The loss's chunking. The automatic budget is (N + V) * D * 4 / 8 bytes
// (an eighth of the float32 gradients), at least 8 MiB; a float32 element
// of a chunk costs 4 bytes, a bfloat16 one 4 + 2 (the float32 copy and the
// input's).
struct ChunkCase {
  std::int64_t n, d, v;
  at::ScalarType dtype;
  bool grad;
};

ChunkPlan chunks(const ChunkCase& c, const LinearCrossEntropyConfig& config = {},
                 bool class_weights = false) {
  return plan_chunks(c.n, c.d, c.v, c.dtype, config, class_weights, c.grad);
}

// N=4096, D=1024, V=32768: budget 36864 * 1024 / 2 = 18874368 bytes;
// whole rows of 32768 * 4 bytes: 144 fit.
TEST(ChunkPlan, Float32TakesTheWholeRowsTheBudgetHolds) {
  const ChunkPlan p = chunks({4096, 1024, 32768, at::kFloat, true});
  EXPECT_EQ(p.tokens, 144);
  EXPECT_EQ(p.vocab, 32768);
}

// The same in bfloat16: 6 bytes per element, 18874368 / (32768 * 6) = 96.
TEST(ChunkPlan, Bfloat16CountsItsInputCopy) {
  const ChunkPlan p = chunks({4096, 1024, 32768, at::kBFloat16, true});
  EXPECT_EQ(p.tokens, 96);
  EXPECT_EQ(p.vocab, 32768);
}

// Label smoothing with class weights keeps a second float32 block: 8 bytes,
// 72 rows.
TEST(ChunkPlan, SmoothedClassWeightsHalveTheRows) {
  LinearCrossEntropyConfig config;
  config.label_smoothing = 0.1;
  const ChunkPlan p = chunks({4096, 1024, 32768, at::kFloat, true}, config, true);
  EXPECT_EQ(p.tokens, 72);
}

// N=4096, D=64, V=262144: budget 266240 * 64 / 2 = 8519680 bytes, 8 whole
// rows (fewer than 32): vocabulary blocks of 512 tokens by
// 8519680 / (512 * 4) = 4160 classes.
TEST(ChunkPlan, LargeVocabularySmallWidthTakesVocabularyBlocks) {
  const ChunkPlan p = chunks({4096, 64, 262144, at::kFloat, true});
  EXPECT_EQ(p.tokens, 512);
  EXPECT_EQ(p.vocab, 4160);
}

// Without a gradient the blocks are 1024 tokens: 8519680 / 4096 = 2080.
TEST(ChunkPlan, ForwardOnlyTakesWideTokenBlocks) {
  const ChunkPlan p = chunks({4096, 64, 262144, at::kFloat, false});
  EXPECT_EQ(p.tokens, 1024);
  EXPECT_EQ(p.vocab, 2080);
}

// Below the 8 MiB floor the floor is the budget: N=64, D=16, V=1000 gives
// 8388608 / 4000 = 2097 rows, more than N: one chunk of all 64.
TEST(ChunkPlan, SmallCallsAreOneChunk) {
  const ChunkPlan p = chunks({64, 16, 1000, at::kFloat, true});
  EXPECT_EQ(p.tokens, 64);
  EXPECT_EQ(p.vocab, 1000);
}

TEST(ChunkPlan, ExplicitSizesAreKeptAndClamped) {
  LinearCrossEntropyConfig config;
  config.chunk_size = 100;
  EXPECT_EQ(chunks({4096, 1024, 32768, at::kFloat, true}, config).tokens, 100);
  config.chunk_size = 10000;
  config.vocab_chunk_size = 50000;
  const ChunkPlan clamped = chunks({4096, 1024, 32768, at::kFloat, true}, config);
  EXPECT_EQ(clamped.tokens, 4096);
  EXPECT_EQ(clamped.vocab, 32768);
}

// A vocabulary block of 1000 classes under a budget of 4000000 bytes holds
// 4000000 / (1000 * 4) = 1000 tokens.
TEST(ChunkPlan, VocabularyBlockTakesTheTokensItsBudgetHolds) {
  LinearCrossEntropyConfig config;
  config.vocab_chunk_size = 1000;
  config.budget_bytes = 4000000;
  const ChunkPlan p = chunks({4096, 1024, 32768, at::kFloat, true}, config);
  EXPECT_EQ(p.tokens, 1000);
  EXPECT_EQ(p.vocab, 1000);
}

TEST(ChunkPlan, NoTokensIsOneEmptyChunk) {
  EXPECT_EQ(chunks({0, 1024, 32768, at::kFloat, true}).tokens, 1);
}

}  // namespace
}  // namespace keel::kernels
