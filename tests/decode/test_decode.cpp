// Decode steps over a KV cache, the module's own or an engine's paged one, against the
// double-precision reference of the whole sequence so far with a causal mask: every step, every
// batch row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "allocation_counter.h"
#include "dtype.h"
#include "mha_contract.h"
#include "problems.h"
#include "scratch_pool.h"
#include "test_seed.h"

namespace {

using mha::reference::Dims;
using mha::reference::Problem;

constexpr double kTolerance = 1e-5;
// With a 16-bit cache, against the reference that rounds its f64 keys and values: an f32 key
// within f32 error of a 16-bit midpoint rounds the other way from its f64 value, one unit in the
// last place of that element (2^-8 relative in bf16, 2^-11 in f16). Over many elements the flips
// average out (up to 2.2e-4 seen at E = 512); over two tokens at E = 24 one flip moved a bf16
// cache's output by 1.7e-3. Exact projections leave no such keys (DecodeCache).
double tolerance(const mha::KvCache &cache) {
    switch (cache.dtype()) {
    case mha::CacheDType::bf16:
        return 4e-3;
    case mha::CacheDType::f16:
        return 5e-4;
    case mha::CacheDType::int8:  // one flip is a 127th of the head's largest |x|
        return 5e-3;
    default:
        return kTolerance;
    }
}

// The element types of the paged caches that modules of the suite's dtype hold: f32 and their
// own dtype (an f32 module's, every dtype).
std::vector<mha::DType> paged_cache_dtypes() {
    const mha::DType dtype = mha::problems::problem_dtype();
    if (dtype == mha::DType::f32) {
        return {mha::contract::kDTypes.begin(), mha::contract::kDTypes.end()};
    }
    return {mha::DType::f32, dtype};
}

// Their own caches: those, and int8.
std::vector<mha::CacheDType> cache_dtypes() {
    std::vector<mha::CacheDType> dtypes;
    for (mha::DType dtype : paged_cache_dtypes()) {
        dtypes.push_back(mha::contract::cache_dtype(dtype));
    }
    dtypes.push_back(mha::CacheDType::int8);
    return dtypes;
}

// A test name of a (case, cache dtype) parameter: "<case>_<dtype>_cache".
template <typename Info>
std::string case_and_cache_dtype(const Info &info) {
    const auto dtype = std::get<1>(info.param);
    std::string_view name;
    if constexpr (std::is_same_v<decltype(dtype), const mha::DType>) {
        name = mha::contract::dtype_name(dtype);
    } else {
        name = mha::contract::cache_dtype_name(dtype);
    }
    return std::string(std::get<0>(info.param).name) + "_" + std::string(name) + "_cache";
}

std::vector<float> random_tokens(int64_t count, int64_t E, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x(count * E);
    for (float &v : x) {
        v = u(rng);
    }
    return x;
}

// The reference's form of a rotation (tables read dense).
std::optional<mha::reference::Rotary> reference_rotary(
    const std::optional<mha::RotaryOptions> &options) {
    if (!options) {
        return std::nullopt;
    }
    mha::reference::Rotary r;
    r.interleaved = options->style == mha::RotaryStyle::interleaved;
    r.rotary_dim = options->rotary_dim;
    r.theta = options->theta;
    if (options->cos) {
        const size_t n = size_t(options->cos->shape[0] * options->cos->shape[1]);
        r.cos.assign(options->cos->data, options->cos->data + n);
        r.sin.assign(options->sin->data, options->sin->data + n);
    }
    return r;
}

// A batch of sequences decoded step by step, each step checked against the reference.
class Decoder {
public:
    // kv_heads: key/value heads (0: as many as heads); the cache in `cache_dtype` (none: the
    // module's), its steps rotating queries and keys by `rotary`.
    Decoder(int64_t batch, int64_t embed_dim, int64_t heads, int64_t capacity, int64_t kv_heads = 0,
            std::optional<mha::CacheDType> cache_dtype = std::nullopt,
            const std::optional<mha::RotaryOptions> &rotary = std::nullopt)
        : E_(embed_dim),
          H_(heads),
          weights_(mha::problems::random_problem({1, 1, 1, embed_dim, heads},
                                                 mha::testing::next_seed(), false, 0, 0, kv_heads)),
          module_(mha::problems::make_module(weights_)),
          cache_(module_.make_cache(batch, capacity, cache_dtype, rotary)),
          sequences_(batch) {
        weights_.rotary = reference_rotary(rotary);
    }

    const mha::MultiHeadAttention &module() const { return module_; }
    mha::KvCache &cache() { return cache_; }

    // One step: row b appends counts[b] new tokens (of n = the largest count); each row's new
    // outputs must match the reference, and padding outputs must be 0. `hidden`, when given,
    // is a key-padding mask [B, capacity] in the keep convention (0 = hidden).
    void step(const std::vector<int64_t> &counts, const std::vector<uint8_t> &keep = {}) {
        const int64_t B = int64_t(sequences_.size());
        const int64_t n = *std::max_element(counts.begin(), counts.end());
        std::vector<float> tokens(B * n * E_, 0.0f), output(B * n * E_, NAN);
        for (int64_t b = 0; b < B; b++) {
            const std::vector<float> x = random_tokens(counts[b], E_, mha::testing::next_seed());
            std::copy(x.begin(), x.end(), tokens.begin() + b * n * E_);
            sequences_[b].insert(sequences_[b].end(), x.begin(), x.end());
        }
        std::optional<mha::Mask> mask;
        if (!keep.empty()) {
            mask = mha::Mask{{keep.data(), {B, cache_.capacity()}}, mha::MaskConvention::keep};
        }
        module_.decode({tokens.data(), {B, n, E_}}, cache_, {output.data(), {B, n, E_}}, mask,
                       counts);
        for (int64_t b = 0; b < B; b++) {
            SCOPED_TRACE(::testing::Message() << "batch row " << b);
            ASSERT_EQ(cache_.lengths()[b], int64_t(sequences_[b].size()) / E_);
            expect_row(b, counts[b], n, output, keep);
        }
    }

    // Forgets all but the first `length` tokens of every row, in the cache and here.
    void truncate(int64_t length) {
        cache_.truncate(length);
        for (std::vector<float> &s : sequences_) {
            s.resize(std::min<size_t>(s.size(), length * E_));
        }
    }

private:
    void expect_row(int64_t b, int64_t count, int64_t n, const std::vector<float> &output,
                    const std::vector<uint8_t> &keep) {
        const int64_t T = int64_t(sequences_[b].size()) / E_;
        for (int64_t t = count; t < n; t++) {
            for (int64_t e = 0; e < E_; e++) {
                ASSERT_EQ(output[(b * n + t) * E_ + e], 0.0f) << "padding token " << t;
            }
        }
        if (count == 0) {
            return;
        }
        std::vector<bool> hidden;
        if (!keep.empty()) {
            for (int64_t j = 0; j < T; j++) {
                hidden.push_back(keep[b * cache_.capacity() + j] == 0);
            }
        }
        const std::vector<double> last =
            mha::reference::decode_outputs(weights_, sequences_[b], count, hidden, cache_.dtype());
        const std::vector<float> got(output.begin() + b * n * E_,
                                     output.begin() + (b * n + count) * E_);
        EXPECT_LT(mha::reference::relative_l2(got, last), tolerance(cache_)) << T << " tokens";
    }

    int64_t E_, H_;
    Problem weights_;
    mha::MultiHeadAttention module_;
    mha::KvCache cache_;
    std::vector<std::vector<float>> sequences_;  // every row's tokens so far
};

struct DecodeCase {
    const char *name;
    int64_t embed_dim, heads, capacity;
    std::vector<int64_t> prompt;  // per batch row
    int64_t kv_heads = 0;         // 0: one per head
};
const DecodeCase kDecodeCases[] = {
    {"one_row_head_dim_4", 12, 3, 11, {4}, 0},
    {"rows_of_different_lengths", 30, 5, 17, {1, 6, 3}, 0},
    {"one_head_d_20", 20, 1, 11, {2, 5}, 0},
    {"head_dim_1", 7, 7, 13, {3, 1}, 0},
    {"several_key_tiles", 16, 2, 151, {67, 130}, 0},
    {"seed_width", 512, 8, 23, {5, 5}, 0},
    {"grouped_query_heads", 24, 6, 19, {5, 2}, 2},
    {"multi_query", 16, 4, 75, {3, 66}, 1},
};

// Each case with each cache its module holds.
class DecodeSteps : public ::testing::TestWithParam<std::tuple<DecodeCase, mha::CacheDType>> {
protected:
    const DecodeCase &c = std::get<0>(GetParam());
    const mha::CacheDType cache_dtype = std::get<1>(GetParam());
};

TEST_P(DecodeSteps, EveryStepMatchesTheWholeSequence) {
    Decoder decoder(int64_t(c.prompt.size()), c.embed_dim, c.heads, c.capacity, c.kv_heads,
                    cache_dtype);
    EXPECT_EQ(decoder.cache().dtype(), cache_dtype);
    decoder.step(c.prompt);  // a prompt chunk, rows of different lengths
    for (int step = 0; step < 4; step++) {
        decoder.step(std::vector<int64_t>(c.prompt.size(), 1));
    }
    decoder.step(std::vector<int64_t>(c.prompt.size(), 2));  // a chunk of two
}

TEST_P(DecodeSteps, KeyPaddingHidesCachePositions) {
    const int64_t B = int64_t(c.prompt.size());
    Decoder decoder(B, c.embed_dim, c.heads, c.capacity, c.kv_heads, cache_dtype);
    std::vector<uint8_t> keep(B * c.capacity);
    std::mt19937_64 rng(mha::testing::next_seed());
    for (uint8_t &k : keep) {
        k = rng() % 4 != 0;
    }
    decoder.step(c.prompt, keep);
    decoder.step(std::vector<int64_t>(B, 1), keep);
}

TEST_P(DecodeSteps, TruncateAndResetStartOver) {
    const int64_t B = int64_t(c.prompt.size());
    Decoder decoder(B, c.embed_dim, c.heads, c.capacity, c.kv_heads, cache_dtype);
    decoder.step(c.prompt);
    decoder.step(std::vector<int64_t>(B, 1));
    decoder.truncate(1);
    decoder.step(std::vector<int64_t>(B, 1));
    decoder.truncate(0);
    decoder.step(std::vector<int64_t>(B, 2));
}

INSTANTIATE_TEST_SUITE_P(Awkward, DecodeSteps,
                         ::testing::Combine(::testing::ValuesIn(kDecodeCases),
                                            ::testing::ValuesIn(cache_dtypes())),
                         case_and_cache_dtype<::testing::TestParamInfo<DecodeSteps::ParamType>>);

// A sequence decoded in one step, token by token, or in chunks gives the same outputs: a token
// never sees the step's later tokens, even when the key padding hides every key it does see
// (its weights are then uniform over those keys, as a causal forward() gives).
TEST(DecodeChunks, SplittingIntoStepsChangesNothing) {
    constexpr int64_t T = 7, E = 12;
    const Problem weights =
        mha::problems::random_problem({1, 1, 1, E, 3}, mha::testing::next_seed());
    const auto module = mha::problems::make_module(weights);
    const std::vector<float> tokens = random_tokens(T, E, mha::testing::next_seed());
    std::vector<uint8_t> keep(T, 1);
    keep[0] = keep[1] = keep[4] = 0;  // tokens 0 and 1 see only hidden keys
    const std::vector<bool> hidden{true, true, false, false, true, false, false};
    for (const std::vector<int64_t> &steps :
         {std::vector<int64_t>{T}, {1, 1, 1, 1, 1, 1, 1}, {3, 4}, {2, 5}}) {
        mha::KvCache cache = module.make_cache(1, T);
        std::vector<float> outputs;
        int64_t done = 0;
        for (int64_t n : steps) {
            std::vector<float> out(n * E);
            module.decode({tokens.data() + done * E, {1, n, E}}, cache, {out.data(), {1, n, E}},
                          mha::Mask{{keep.data(), {1, T}}, mha::MaskConvention::keep});
            outputs.insert(outputs.end(), out.begin(), out.end());
            done += n;
        }
        EXPECT_LT(
            mha::reference::relative_l2(
                outputs, mha::reference::decode_outputs(weights, tokens, T, hidden, cache.dtype())),
            tolerance(cache))
            << steps.size() << " steps";
    }
}

// With more threads than batch rows x key/value heads, a step splits the cache among them (at
// least two key tiles each) and merges the splits by log-sum-exp: each thread count must give
// the reference's outputs, with one key/value head and with groups of them, with key padding,
// rows of different lengths and steps of several tokens.
struct SplitCase {
    const char *name;
    int64_t batch, embed_dim, heads, kv_heads, capacity, prompt;
};
class DecodeSplits : public ::testing::TestWithParam<std::tuple<SplitCase, int>> {
protected:
    void TearDown() override { mha::set_num_threads(0); }
};

TEST_P(DecodeSplits, EveryThreadCountMatchesTheReference) {
    const auto &[c, threads] = GetParam();
    mha::set_num_threads(threads);
    for (mha::CacheDType cache_dtype : cache_dtypes()) {
        SCOPED_TRACE(mha::contract::cache_dtype_name(cache_dtype));
        Decoder decoder(c.batch, c.embed_dim, c.heads, c.capacity, c.kv_heads, cache_dtype);
        std::vector<uint8_t> keep(c.batch * c.capacity, 1);
        std::mt19937_64 rng(mha::testing::next_seed());
        for (uint8_t &k : keep) {
            k = rng() % 5 != 0;
        }
        std::vector<int64_t> prompt(c.batch);
        for (int64_t b = 0; b < c.batch; b++) {
            prompt[b] = c.prompt - 61 * b;  // rows of different lengths
        }
        decoder.step(prompt, keep);
        decoder.step(std::vector<int64_t>(c.batch, 1));
        decoder.step(std::vector<int64_t>(c.batch, 3), keep);
    }
}

const SplitCase kSplitCases[] = {
    {"multi_query_d_128", 1, 512, 4, 1, 331, 300},
    {"groups_of_3_d_16", 2, 96, 6, 2, 557, 411},
    {"one_head_d_13", 1, 13, 1, 1, 389, 300},
};
INSTANTIATE_TEST_SUITE_P(Long, DecodeSplits,
                         ::testing::Combine(::testing::ValuesIn(kSplitCases),
                                            ::testing::Values(1, 3, 8)),
                         [](const auto &info) {
                             return std::string(std::get<0>(info.param).name) + "_" +
                                    std::to_string(std::get<1>(info.param)) + "_threads";
                         });

// x, within [-1, 1], on a grid of 2^-bits.
void to_grid(std::vector<float> &x, int bits) {
    for (float &v : x) {
        v = std::ldexp(std::nearbyint(std::ldexp(v, bits)), -bits);
    }
}

// A 16-bit cache holds each key and value rounded to its type once. With weights and biases on
// a grid of 2^-8 (which a 16-bit module rounds again, as the reference does) and tokens on one
// of 2^-6, the projections are exact in f32 (sums of 24 products on a 2^-14 grid, below 2^5),
// so the kernels round exactly the keys and values the reference rounds: the outputs match it
// to f32 arithmetic, and differ from those of an f32 cache by the rounding.
TEST(DecodeCache, SixteenBitCachesHoldTheKeysAndValuesRounded) {
    constexpr int64_t T = 9, E = 24;
    Problem weights = mha::problems::random_problem({1, 1, 1, E, 4}, mha::testing::next_seed());
    for (int l = 0; l < 4; l++) {
        to_grid(weights.weight[l], 8);
        to_grid(weights.bias[l], 8);
    }
    const auto module = mha::problems::make_module(weights);
    std::vector<float> tokens = random_tokens(T, E, mha::testing::next_seed());
    to_grid(tokens, 6);
    for (mha::CacheDType dtype : cache_dtypes()) {
        if (dtype == mha::CacheDType::f32 || dtype == mha::CacheDType::int8) {
            continue;
        }
        SCOPED_TRACE(mha::contract::cache_dtype_name(dtype));
        mha::KvCache cache = module.make_cache(1, T, dtype);
        std::vector<float> outputs(T * E);
        int64_t done = 0;
        for (int64_t n : {5, 1, 1, 1, 1}) {
            module.decode({tokens.data() + done * E, {1, n, E}}, cache,
                          {outputs.data() + done * E, {1, n, E}});
            done += n;
        }
        EXPECT_LT(mha::reference::relative_l2(
                      outputs, mha::reference::decode_outputs(weights, tokens, T, {}, dtype)),
                  kTolerance);
        // The rounding moves the outputs by about 1e-4 (the least over 300 seeds: 8e-5, f16),
        // far from the f32 arithmetic's 1e-6.
        EXPECT_GT(mha::reference::relative_l2(
                      outputs, mha::reference::decode_outputs(weights, tokens, T, {})),
                  5 * kTolerance);
    }
}

// An int8 cache holds each token's key and value heads quantized, one scale each: at a model's
// width, over a prompt and steps, the outputs stay within 2e-2 (relative L2) of those of exact
// keys and values, and differ from them by more than f32 arithmetic does.
TEST(DecodeCache, Int8CachesStayNearTheExactOutputs) {
    constexpr int64_t T = 70, E = 256;
    const Problem weights =
        mha::problems::random_problem({1, 1, 1, E, 4}, mha::testing::next_seed(), false, 0, 0, 2);
    const auto module = mha::problems::make_module(weights);
    const std::vector<float> tokens = random_tokens(T, E, mha::testing::next_seed());
    mha::KvCache cache = module.make_cache(1, T, mha::CacheDType::int8);
    std::vector<float> outputs(T * E);
    int64_t done = 0;
    for (int64_t n : {67, 1, 2}) {
        module.decode({tokens.data() + done * E, {1, n, E}}, cache,
                      {outputs.data() + done * E, {1, n, E}});
        done += n;
    }
    const double error =
        mha::reference::relative_l2(outputs, mha::reference::decode_outputs(weights, tokens, T));
    EXPECT_LT(error, 2e-2);
    EXPECT_GT(error, 5 * kTolerance);
}

TEST(DecodeCapacity, AStepThatDoesNotFitChangesNothing) {
    Decoder decoder(2, 12, 3, 5);
    decoder.step({3, 2});
    std::vector<float> tokens(2 * 3 * 12, 0.5f), output(2 * 3 * 12);
    try {
        decoder.module().decode({tokens.data(), {2, 3, 12}}, decoder.cache(),
                                {output.data(), {2, 3, 12}});
        FAIL() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "batch row 0 holds 3 tokens of its capacity 5: 3 more do not fit");
    }
    EXPECT_EQ(decoder.cache().lengths(), (std::vector<int64_t>{3, 2}));
    decoder.step({2, 3});  // still usable, and exactly full
    EXPECT_EQ(decoder.cache().lengths(), (std::vector<int64_t>{5, 5}));
}

TEST(DecodeErrors, BadArgumentsNameThemselves) {
    Decoder decoder(2, 12, 3, 8);
    std::vector<float> tokens(2 * 1 * 12), output(2 * 1 * 12);
    const auto expect_error = [&](const mha::Tensor &t, const mha::MutableTensor &o,
                                  const std::vector<int64_t> &counts, const char *message) {
        try {
            decoder.module().decode(t, decoder.cache(), o, std::nullopt, counts);
            ADD_FAILURE() << "no error; expected " << message;
        } catch (const mha::Error &e) {
            EXPECT_STREQ(e.what(), message);
        }
    };
    expect_error({tokens.data(), {3, 1, 12}}, {output.data(), {3, 1, 12}}, {},
                 "tokens has shape [3, 1, 12] but must be [2, 1, 12]");
    expect_error({tokens.data(), {2, 1, 12}}, {output.data(), {2, 2, 12}}, {},
                 "output has shape [2, 2, 12] but must be [2, 1, 12]");
    expect_error({tokens.data(), {2, 1, 12}}, {output.data(), {2, 1, 12}}, {1},
                 "new_tokens has 1 counts for a batch of 2");
    expect_error({tokens.data(), {2, 1, 12}}, {output.data(), {2, 1, 12}}, {1, 2},
                 "new_tokens[1] is 2: must be 0 to 1");
    const auto other = mha::problems::make_module(
        mha::problems::random_problem({1, 1, 1, 12, 3}, mha::testing::next_seed()));
    try {
        other.decode({tokens.data(), {2, 1, 12}}, decoder.cache(), {output.data(), {2, 1, 12}});
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "the cache was made by another module");
    }
    const auto cross = mha::problems::make_module(
        mha::problems::random_problem({1, 1, 1, 12, 3}, mha::testing::next_seed(), false, 7, 12));
    try {
        cross.make_cache(1, 4);
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(
            e.what(),
            "decode steps are self-attention: kdim 7 and vdim 12 must be the embed_dim 12");
    }
    try {
        decoder.module().make_cache(1, 4, mha::DType(9));
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "dtype 9 is none of f32, bf16 and f16");
    }
    try {
        decoder.module().make_cache(1, 4, mha::CacheDType(9));
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "dtype 9 is none of f32, bf16, f16 and int8");
    }
    Problem bf16 = mha::problems::random_problem({1, 1, 1, 12, 3}, mha::testing::next_seed());
    bf16.dtype = mha::DType::bf16;
    try {
        mha::problems::make_module(bf16).make_cache(1, 4, mha::DType::f16);
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(), "a f16 cache for a bf16 module: it holds bf16, f32 or int8");
    }
}

// --- Rotary position embeddings in decode steps (make_cache's `rotary`) ----------------------

// Angles from theta (positions here stay under 80: the library computes them in f32, as
// transformers does, at most position · 2^-24 radians from the reference's f64 ones), or from
// caller-given tables.
struct RotaryDecodeCase {
    const char *name;
    int64_t embed_dim, heads, kv_heads, rotary_dim;
    mha::RotaryStyle style;
    float theta;
    bool tables;
};
const RotaryDecodeCase kRotaryDecodeCases[] = {
    {"llama_rotate_half_grouped", 64, 4, 2, 0, mha::RotaryStyle::rotate_half, 10000, false},
    {"gpt_j_interleaved_partial", 36, 3, 3, 6, mha::RotaryStyle::interleaved, 500, false},
    {"tables_multi_query_d_10", 40, 4, 1, 4, mha::RotaryStyle::rotate_half, 0, true},
};

// Tables [rows, pairs] of random angles.
struct RotaryTables {
    std::vector<float> cos, sin;
    RotaryTables(int64_t rows, int64_t pairs, uint64_t seed) {
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> angle(-3.14f, 3.14f);
        for (int64_t n = 0; n < rows * pairs; n++) {
            const float a = angle(rng);
            cos.push_back(std::cos(a));
            sin.push_back(std::sin(a));
        }
    }
};

mha::RotaryOptions rotation(mha::RotaryStyle style, int64_t rotary_dim, float theta) {
    mha::RotaryOptions options;
    options.style = style;
    options.rotary_dim = rotary_dim;
    options.theta = theta;
    return options;
}

// A dense table view [rows, pairs].
mha::StridedView<const float> table_view(const std::vector<float> &table, int64_t rows,
                                         int64_t pairs) {
    return {table.data(), {rows, pairs}, {}};
}

mha::RotaryOptions rotary_options(const RotaryDecodeCase &c, const RotaryTables *tables,
                                  int64_t rows) {
    mha::RotaryOptions options = rotation(c.style, c.rotary_dim, c.theta);
    if (tables != nullptr) {
        options.cos = table_view(tables->cos, rows, c.rotary_dim / 2);
        options.sin = table_view(tables->sin, rows, c.rotary_dim / 2);
    }
    return options;
}

class DecodeRotary
    : public ::testing::TestWithParam<std::tuple<RotaryDecodeCase, mha::CacheDType>> {};

// Prompts of different lengths, then steps of one token and of none (padding rows): every output
// against the reference that rotates the whole sequence's queries and keys at their positions.
// The tables are freed once the cache is made (it copies them).
TEST_P(DecodeRotary, EveryStepMatchesTheRotatedSequence) {
    const auto &[c, cache_dtype] = GetParam();
    constexpr int64_t kCapacity = 40;
    std::optional<Decoder> decoder;
    {
        const RotaryTables tables(kCapacity, c.rotary_dim / 2, mha::testing::next_seed());
        decoder.emplace(3, c.embed_dim, c.heads, kCapacity, c.kv_heads, cache_dtype,
                        rotary_options(c, c.tables ? &tables : nullptr, kCapacity));
    }
    EXPECT_TRUE(decoder->cache().rotary());
    decoder->step({5, 1, 9});
    for (int step = 0; step < 6; step++) {
        decoder->step({1, step % 2, 1});
    }
    decoder->step({3, 0, 2});
}

INSTANTIATE_TEST_SUITE_P(Awkward, DecodeRotary,
                         ::testing::Combine(::testing::ValuesIn(kRotaryDecodeCases),
                                            ::testing::ValuesIn(cache_dtypes())),
                         case_and_cache_dtype<::testing::TestParamInfo<DecodeRotary::ParamType>>);

// Bad options raise mha::Error at make_cache; a step past the tables' positions raises it before
// anything is written.
TEST(DecodeRotaryErrors, BadOptionsAndPositionsNameThemselves) {
    const RotaryDecodeCase c{"tables", 16, 2, 2, 4, mha::RotaryStyle::rotate_half, 0, true};
    const RotaryTables tables(6, 2, mha::testing::next_seed());
    Decoder decoder(2, c.embed_dim, c.heads, 10, c.kv_heads, std::nullopt,
                    rotary_options(c, &tables, 6));
    decoder.step({4, 2});
    std::vector<float> tokens(2 * 3 * 16), output(2 * 3 * 16);
    try {
        decoder.module().decode({tokens.data(), {2, 3, 16}}, decoder.cache(),
                                {output.data(), {2, 3, 16}});
        ADD_FAILURE() << "no error";
    } catch (const mha::Error &e) {
        EXPECT_STREQ(e.what(),
                     "batch row 0 would reach position 6: the cache's rotary tables have "
                     "positions 0 to 5");
    }
    EXPECT_EQ(decoder.cache().lengths(), (std::vector<int64_t>{4, 2}));
    decoder.step({1, 2});  // positions 4 and 2-3: within the tables
    const auto expect_error = [&](const mha::RotaryOptions &options, const char *message) {
        try {
            decoder.module().make_cache(1, 4, std::nullopt, options);
            ADD_FAILURE() << "no error; expected " << message;
        } catch (const mha::Error &e) {
            EXPECT_STREQ(e.what(), message);
        }
    };
    expect_error(rotation(mha::RotaryStyle::rotate_half, 3, 10000),
                 "rotary_dim 3 must be even and within the 8 features (0: all)");
    expect_error(rotation(mha::RotaryStyle::interleaved, 0, -1.0f),
                 "theta -1 must be finite and > 0");
    mha::RotaryOptions one_table = rotary_options(c, &tables, 6);
    one_table.sin.reset();
    expect_error(one_table,
                 "cos and sin: give both tables or neither (theta then gives the angles)");
}

// Once a step with as many new tokens has run, a step allocates nothing: no heap allocation by
// the library, and no new block for Halide's buffers. A module of a 16-bit dtype converts the
// tokens and the output through the scratch pool too; only the converted views' shapes (two
// vectors each) come from the heap.
// On one thread: the pool holds as many blocks as the step's parallel tasks hold at once, which
// on more threads depends on how the thread pool interleaved them (a thread waiting for a nested
// loop takes up other tasks, each holding its buffers), so that a late step can still add one
// block (seen under the sanitizers after 8 and after 24 steps without one); on one thread the
// count is fixed by the first step.
// So does a step that rotates its tokens.
TEST(DecodeAllocations, AStepAllocatesNothing) {
    mha::set_num_threads(1);
    for (const std::optional<mha::RotaryOptions> &rotary :
         {std::optional<mha::RotaryOptions>(), std::optional(mha::RotaryOptions{})}) {
        SCOPED_TRACE(rotary ? "rotary" : "no rotary");
        Decoder decoder(2, 64, 4, 40, 0, std::nullopt, rotary);
        decoder.step({7, 3});
        decoder.step({1, 1});
        std::vector<float> tokens(2 * 64, 0.25f), output(2 * 64);
        const mha::Tensor token_view{tokens.data(), {2, 1, 64}};
        const mha::MutableTensor output_view{output.data(), {2, 1, 64}};
        const size_t blocks = mha::detail::scratch_blocks_allocated();
        mha::testing::start_counting_allocations();
        decoder.module().decode(token_view, decoder.cache(), output_view);
        const size_t shape_copies = decoder.module().dtype() == mha::DType::f32 ? 0 : 4;
        EXPECT_EQ(mha::testing::stop_counting_allocations(), shape_copies);
        EXPECT_EQ(mha::detail::scratch_blocks_allocated(), blocks);
    }
    mha::set_num_threads(0);
}

// --- Decode steps over a paged cache (decode with a PagedDecodeCache) ---------------------------

// With a 16-bit paged cache the query and the attention's output are rounded to it too.
double paged_tolerance(mha::DType cache_dtype) {
    return cache_dtype == mha::DType::bf16 ? 1e-2 : cache_dtype == mha::DType::f16 ? 2e-3 : 1e-5;
}

// Sequences decoded one token a step over a paged cache of T elements whose blocks
// PagedBlockTables hands out; rows that take no token in a step are padding (slot -1).
template <typename T>
class PagedDecoder {
public:
    PagedDecoder(int64_t sequences, int64_t embed_dim, int64_t heads, int64_t kv_heads,
                 int64_t block_size, int64_t num_blocks, int64_t max_blocks,
                 const std::optional<mha::RotaryOptions> &rotary = std::nullopt)
        : B_(sequences),
          E_(embed_dim),
          weights_(mha::problems::random_problem({1, 1, 1, embed_dim, heads},
                                                 mha::testing::next_seed(), false, 0, 0, kv_heads)),
          module_(mha::problems::make_module(weights_)),
          tables_(num_blocks, block_size, sequences, max_blocks),
          key_pool_(size_t(num_blocks * block_size * embed_dim / heads * module_.num_kv_heads())),
          value_pool_(key_pool_.size()),
          slots_(size_t(sequences)),
          tokens_(size_t(sequences * embed_dim)),
          output_(size_t(sequences * embed_dim)),
          sequences_(size_t(sequences)) {
        const std::vector<int64_t> pages{num_blocks, block_size, module_.num_kv_heads(),
                                         module_.head_dim()};
        cache_ = {
            {key_pool_.data(), pages, {}}, {value_pool_.data(), pages, {}},  tables_.block_table(),
            tables_.sequence_lengths(),    {slots_.data(), {sequences}, {}}, rotary};
        weights_.rotary = reference_rotary(rotary);
        for (std::vector<float> &s : sequences_) {
            s.reserve(size_t(max_blocks * block_size * embed_dim));
        }
    }

    const mha::MultiHeadAttention &module() const { return module_; }
    const mha::PagedDecodeCache<T> &cache() const { return cache_; }
    mha::Tensor tokens() const { return {tokens_.data(), {B_, 1, E_}}; }
    mha::MutableTensor output() { return {output_.data(), {B_, 1, E_}}; }
    const std::vector<T> &key_pool() const { return key_pool_; }

    // One step: each row with `active` set takes a token; the outputs must match the reference
    // of each sequence so far, and padding rows must be 0.
    void step(const std::vector<bool> &active) {
        const std::vector<float> x = random_tokens(B_, E_, mha::testing::next_seed());
        std::copy(x.begin(), x.end(), tokens_.begin());
        for (int64_t b = 0; b < B_; b++) {
            slots_[size_t(b)] = -1;
            if (active[size_t(b)]) {
                const int64_t length = tables_.length(b);
                tables_.resize(b, length + 1);
                slots_[size_t(b)] = tables_.slot(b, length);
                sequences_[size_t(b)].insert(sequences_[size_t(b)].end(), x.begin() + b * E_,
                                             x.begin() + (b + 1) * E_);
            }
        }
        std::fill(output_.begin(), output_.end(), NAN);
        module_.decode(tokens(), cache_, output());
        for (int64_t b = 0; b < B_; b++) {
            SCOPED_TRACE(::testing::Message()
                         << "sequence " << b << " of " << tables_.length(b) << " tokens");
            const std::vector<float> got(output_.begin() + b * E_, output_.begin() + (b + 1) * E_);
            if (!active[size_t(b)]) {
                EXPECT_EQ(got, std::vector<float>(size_t(E_), 0.0f));
                continue;
            }
            EXPECT_LT(mha::reference::relative_l2(
                          got, mha::reference::decode_outputs(
                                   weights_, sequences_[size_t(b)], 1, {},
                                   mha::contract::cache_dtype(mha::detail::dtype_of<T>()))),
                      paged_tolerance(mha::detail::dtype_of<T>()));
        }
    }

    // Ends sequence b, its blocks back in the pool.
    void end(int64_t b) {
        tables_.resize(b, 0);
        sequences_[size_t(b)].clear();
    }

private:
    int64_t B_, E_;
    Problem weights_;
    mha::MultiHeadAttention module_;
    mha::PagedBlockTables tables_;
    std::vector<T> key_pool_, value_pool_;
    std::vector<int64_t> slots_;
    std::vector<float> tokens_, output_;
    mha::PagedDecodeCache<T> cache_;
    std::vector<std::vector<float>> sequences_;  // every sequence's tokens so far
};

// fn.template operator()<T>() with T the element type of `dtype`.
template <typename Fn>
void with_element_type(mha::DType dtype, Fn &&fn) {
    switch (dtype) {
    case mha::DType::f32:
        return fn(float{});
    case mha::DType::bf16:
        return fn(mha::bfloat16{});
    case mha::DType::f16:
        return fn(mha::float16{});
    }
}

struct PagedModuleCase {
    const char *name;
    int64_t sequences, embed_dim, heads, kv_heads, block_size, num_blocks, max_blocks, steps;
};
const PagedModuleCase kPagedModuleCases[] = {
    {"grouped_heads_blocks_of_16", 5, 24, 6, 2, 16, 12, 4, 41},
    {"one_head_d_20_blocks_of_32", 3, 20, 1, 1, 32, 5, 2, 37},
    {"multi_query_d_16", 2, 64, 4, 1, 16, 6, 3, 45},
};

class PagedModuleDecode : public ::testing::TestWithParam<std::tuple<PagedModuleCase, mha::DType>> {
};

// Sequences start, grow by one token in the steps they take part in, and end (their blocks
// reused by the others): every output against the reference of its sequence alone.
TEST_P(PagedModuleDecode, EveryStepMatchesItsSequence) {
    const auto &[c, cache_dtype] = GetParam();
    with_element_type(cache_dtype, [&, &c = c](auto element) {
        PagedDecoder<decltype(element)> decoder(c.sequences, c.embed_dim, c.heads, c.kv_heads,
                                                c.block_size, c.num_blocks, c.max_blocks);
        std::mt19937_64 rng(mha::testing::next_seed());
        for (int64_t step = 0; step < c.steps; step++) {
            std::vector<bool> active(size_t(c.sequences));
            for (int64_t b = 0; b < c.sequences; b++) {
                active[size_t(b)] = rng() % 4 != 0;
            }
            decoder.step(active);
            if (step % 13 == 12) {
                decoder.end(int64_t(rng() % uint64_t(c.sequences)));
            }
        }
    });
}

INSTANTIATE_TEST_SUITE_P(
    Awkward, PagedModuleDecode,
    ::testing::Combine(::testing::ValuesIn(kPagedModuleCases),
                       ::testing::ValuesIn(paged_cache_dtypes())),
    case_and_cache_dtype<::testing::TestParamInfo<PagedModuleDecode::ParamType>>);

// With a rotation, each new token's query and key rotated at its position (its sequence's
// length - 1) before the key is written: every output against the rotated reference.
TEST(PagedModuleDecodeRotary, EveryStepMatchesItsRotatedSequence) {
    for (const mha::DType cache_dtype : paged_cache_dtypes()) {
        SCOPED_TRACE(mha::contract::dtype_name(cache_dtype));
        with_element_type(cache_dtype, [&](auto element) {
            const RotaryTables tables(64, 3, mha::testing::next_seed());
            for (const bool use_tables : {false, true}) {
                const RotaryDecodeCase c{"paged", 48,        4, 2, 6, mha::RotaryStyle::interleaved,
                                         1000,    use_tables};
                PagedDecoder<decltype(element)> decoder(
                    3, c.embed_dim, c.heads, c.kv_heads, 16, 8, 4,
                    rotary_options(c, use_tables ? &tables : nullptr, 64));
                std::mt19937_64 rng(mha::testing::next_seed());
                for (int step = 0; step < 40; step++) {
                    decoder.step({true, rng() % 3 != 0, step % 2 == 0});
                }
            }
        });
    }
}

// As for a contiguous cache (DecodeAllocations): nothing allocated once a step of as many rows
// ran, the converted tokens' and output's shapes of a 16-bit module aside.
TEST(PagedModuleDecodeAllocations, AStepAllocatesNothing) {
    mha::set_num_threads(1);
    PagedDecoder<float> decoder(3, 64, 4, 2, 16, 8, 4);
    decoder.step({true, true, false});
    decoder.step({true, false, true});
    const mha::Tensor tokens = decoder.tokens();
    const mha::MutableTensor output = decoder.output();
    const size_t blocks = mha::detail::scratch_blocks_allocated();
    mha::testing::start_counting_allocations();
    decoder.module().decode(tokens, decoder.cache(), output);
    const size_t shape_copies = decoder.module().dtype() == mha::DType::f32 ? 0 : 4;
    EXPECT_EQ(mha::testing::stop_counting_allocations(), shape_copies);
    EXPECT_EQ(mha::detail::scratch_blocks_allocated(), blocks);
    mha::set_num_threads(0);
}

// Bad arguments raise mha::Error naming them, and leave the cache as it was.
TEST(PagedModuleDecodeErrors, BadArgumentsChangeNothing) {
    PagedDecoder<float> decoder(2, 12, 3, 3, 16, 4, 2);
    decoder.step({true, true});
    const std::vector<float> pool = decoder.key_pool();
    // Room for the largest shape: a 16-bit module converts the tokens before it checks them.
    std::vector<float> tokens(4 * 12), output(4 * 12);
    std::vector<int64_t> far_slot{0, 64};
    const auto expect_error = [&](const mha::Tensor &t, const mha::MutableTensor &o,
                                  const mha::PagedDecodeCache<float> &cache, const char *message) {
        try {
            decoder.module().decode(t, cache, o);
            ADD_FAILURE() << "no error; expected " << message;
        } catch (const mha::Error &e) {
            EXPECT_STREQ(e.what(), message);
        }
        EXPECT_EQ(decoder.key_pool(), pool);
    };
    expect_error({tokens.data(), {2, 2, 12}}, {output.data(), {2, 2, 12}}, decoder.cache(),
                 "tokens has shape [2, 2, 12] but must be [2, 1, 12]");
    expect_error({tokens.data(), {3, 1, 12}}, {output.data(), {3, 1, 12}}, decoder.cache(),
                 "slot_mapping has 2 slots for a batch of 3");
    mha::PagedDecodeCache<float> cache = decoder.cache();
    cache.slot_mapping = {far_slot.data(), {2}, {}};
    expect_error(decoder.tokens(), decoder.output(), cache,
                 "slot_mapping[1] is 64: the cache has slots 0 to 63");
    cache = decoder.cache();
    std::vector<float> cos(2), sin(2);  // one position, for two pairs
    std::vector<int32_t> lengths{2, 2};
    cache.sequence_lengths = {lengths.data(), {2}, {}};
    cache.rotary = rotation(mha::RotaryStyle::rotate_half, 0, 10000);
    cache.rotary->cos = table_view(cos, 1, 2);
    cache.rotary->sin = table_view(sin, 1, 2);
    expect_error(decoder.tokens(), decoder.output(), cache,
                 "sequence_lengths[0] is 2: the new token's position 1 is not in the rotary "
                 "tables' 0 to 0");
    cache = decoder.cache();
    cache.key_cache.shape = {4, 16, 1, 4};
    cache.value_cache.shape = {4, 16, 1, 4};
    expect_error(decoder.tokens(), decoder.output(), cache,
                 "key_cache [4, 16, 1, 4] and value_cache [4, 16, 1, 4]: this module's caches "
                 "hold 3 key/value heads of 4 features");
}

}  // namespace
