// Decode steps over a paged KV cache (mha::paged_attention, write_paged_cache,
// PagedBlockTables) against the double-precision reference of each sequence alone: blocks handed
// out in a shuffled order, sequences of different lengths (one and none among them), grouped
// heads, windows, soft-capping and ALiBi, in each dtype; and a serving run of many sequences
// started, grown and ended through the tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "allocation_counter.h"
#include "attention.h"
#include "dtype.h"
#include "mha_contract.h"
#include "reference.h"
#include "test_seed.h"

namespace {

using mha::reference::AttentionProblem;

// A paged cache of `dtype` elements with its block tables, and each sequence's keys and values
// as the cache holds them (rounded to the dtype), for the reference.
template <typename T>
class PagedSequences {
public:
    PagedSequences(int64_t sequences, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   int64_t value_dim, int64_t num_blocks, int64_t block_size, int64_t max_blocks)
        : H_(heads),
          Hkv_(kv_heads),
          d_(head_dim),
          dv_(value_dim),
          tables_(num_blocks, block_size, sequences, max_blocks),
          key_cache_(size_t(num_blocks * block_size * kv_heads * head_dim)),
          value_cache_(size_t(num_blocks * block_size * kv_heads * value_dim)),
          keys_(size_t(sequences)),
          values_(size_t(sequences)),
          query_(size_t(sequences * heads * head_dim)),
          output_(size_t(sequences * heads * value_dim)),
          lse_(size_t(sequences * heads)),
          new_keys_(size_t(max_blocks * block_size * kv_heads * head_dim)),
          new_values_(size_t(max_blocks * block_size * kv_heads * value_dim)),
          slots_(size_t(max_blocks * block_size)) {
        const int64_t B = sequences;
        cache_ = {{key_cache_.data(), {num_blocks, block_size, Hkv_, d_}, {}},
                  {value_cache_.data(), {num_blocks, block_size, Hkv_, dv_}, {}},
                  tables_.block_table(),
                  tables_.sequence_lengths()};
        query_view_ = {query_.data(), {B, 1, H_, d_}, {}};
        output_view_ = {output_.data(), {B, 1, H_, dv_}, {}};
        lse_options_.lse = {lse_.data(), {B, H_, 1}, {}};
        key_pages_ = {key_cache_.data(), cache_.key_cache.shape, {}};
        value_pages_ = {value_cache_.data(), cache_.value_cache.shape, {}};
        one_key_ = {new_keys_.data(), {1, Hkv_, d_}, {}};
        one_value_ = {new_values_.data(), {1, Hkv_, dv_}, {}};
        one_slot_ = {slots_.data(), {1}, {}};
        // Reserved once: the serving run counts the library's allocations alone.
        for (int64_t b = 0; b < B; b++) {
            keys_[size_t(b)].reserve(size_t(max_blocks * block_size * Hkv_ * d_));
            values_[size_t(b)].reserve(size_t(max_blocks * block_size * Hkv_ * dv_));
        }
    }

    mha::PagedBlockTables &tables() { return tables_; }
    int64_t length(int64_t b) const { return tables_.length(b); }

    // Appends `count` random tokens to sequence b (0 and a length: starts it), writing their keys
    // and values into the blocks the tables hand it.
    void append(int64_t b, int64_t count, std::mt19937_64 &rng) {
        const int64_t start = tables_.length(b);
        tables_.resize(b, start + count);
        std::uniform_real_distribution<float> u(-1, 1);
        for (int64_t t = 0; t < count; t++) {
            slots_[size_t(t)] = tables_.slot(b, start + t);
            for (int64_t f = 0; f < Hkv_ * d_; f++) {
                new_keys_[size_t(t * Hkv_ * d_ + f)] = narrow(u(rng));
                keys_[size_t(b)].push_back(widen(new_keys_[size_t(t * Hkv_ * d_ + f)]));
            }
            for (int64_t f = 0; f < Hkv_ * dv_; f++) {
                new_values_[size_t(t * Hkv_ * dv_ + f)] = narrow(u(rng));
                values_[size_t(b)].push_back(widen(new_values_[size_t(t * Hkv_ * dv_ + f)]));
            }
        }
        if (count == 1) {  // views made once: a step's token allocates nothing here
            mha::write_paged_cache(one_key_, one_value_, key_pages_, value_pages_, one_slot_);
        } else {
            mha::write_paged_cache<T>({new_keys_.data(), {count, Hkv_, d_}, {}},
                                      {new_values_.data(), {count, Hkv_, dv_}, {}}, key_pages_,
                                      value_pages_, {slots_.data(), {count}, {}});
        }
    }

    void end(int64_t b) {
        tables_.resize(b, 0);
        keys_[size_t(b)].clear();
        values_[size_t(b)].clear();
    }

    void random_queries(std::mt19937_64 &rng) {
        std::uniform_real_distribution<float> u(-1, 1);
        for (T &q : query_) {
            q = narrow(u(rng));
        }
    }

    // Each sequence's keys in `splits` splits in run() without options.
    void split_keys(int splits) { lse_options_.num_splits = splits; }

    // With the lse, and the options `options` gives (none: nothing allocated here).
    void run(std::optional<mha::AttentionOptions> options = std::nullopt) {
        if (!options) {
            mha::paged_attention(query_view_, cache_, output_view_, lse_options_);
            return;
        }
        options->lse = lse_options_.lse;
        mha::paged_attention(query_view_, cache_, output_view_, *options);
    }

    // Every sequence's output and lse against the reference of it alone; a sequence of no keys
    // against zeros and -inf.
    void expect_reference(const AttentionProblem &options, double tolerance) const {
        for (int64_t b = 0; b < int64_t(keys_.size()); b++) {
            SCOPED_TRACE(::testing::Message() << "sequence " << b << " of " << length(b));
            const int64_t L = length(b);
            std::vector<float> got(size_t(H_ * dv_));
            for (size_t e = 0; e < got.size(); e++) {
                got[e] = widen(output_[size_t(b * H_ * dv_) + e]);
            }
            if (L == 0) {
                EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return x == 0; }));
                EXPECT_EQ(lse_[size_t(b * H_)], -INFINITY);
                continue;
            }
            AttentionProblem p = options;
            p.batch = 1;
            p.heads = H_;
            p.kv_heads = Hkv_;
            p.query_len = 1;
            p.key_len = L;
            p.head_dim = d_;
            p.value_dim = dv_;
            p.causal = mha::Causal::bottom_right;
            p.query.resize(size_t(H_ * d_));
            for (size_t f = 0; f < p.query.size(); f++) {
                p.query[f] = widen(query_[size_t(b * H_ * d_) + f]);
            }
            // [L, Hkv, d] as the reference's [Hkv, L, d].
            p.key.resize(size_t(Hkv_ * L * d_));
            p.value.resize(size_t(Hkv_ * L * dv_));
            for (int64_t j = 0; j < L; j++) {
                for (int64_t h = 0; h < Hkv_; h++) {
                    std::copy_n(&keys_[size_t(b)][size_t((j * Hkv_ + h) * d_)], d_,
                                &p.key[size_t((h * L + j) * d_)]);
                    std::copy_n(&values_[size_t(b)][size_t((j * Hkv_ + h) * dv_)], dv_,
                                &p.value[size_t((h * L + j) * dv_)]);
                }
            }
            const mha::reference::AttentionResult want = mha::reference::attention(p);
            EXPECT_LT(mha::reference::relative_l2(got, want.output), tolerance);
            const std::vector<float> lse(lse_.begin() + b * H_, lse_.begin() + (b + 1) * H_);
            EXPECT_LT(mha::reference::relative_l2(lse, want.lse), 1e-5);
        }
    }

private:
    static T narrow(float x) {
        T out;
        mha::detail::convert(&x, &out, 1);
        return out;
    }
    static float widen(T x) {
        float out;
        mha::detail::convert(&x, &out, 1);
        return out;
    }

    int64_t H_, Hkv_, d_, dv_;
    mha::PagedBlockTables tables_;
    std::vector<T> key_cache_, value_cache_;
    std::vector<std::vector<float>> keys_, values_;  // per sequence, [length, Hkv, d | dv]
    std::vector<T> query_, output_;
    std::vector<float> lse_;
    std::vector<T> new_keys_, new_values_;
    std::vector<int64_t> slots_;
    mha::PagedKvCache<T> cache_;
    mha::StridedView<const T> query_view_, one_key_, one_value_;
    mha::StridedView<T> output_view_, key_pages_, value_pages_;
    mha::StridedView<const int64_t> one_slot_;
    mha::AttentionOptions lse_options_;
};

// 16-bit outputs are rounded once: a relative L2 of about their precision.
template <typename T>
double output_tolerance() {
    if constexpr (std::is_same_v<T, mha::bfloat16>) {
        return 1e-2;
    } else if constexpr (std::is_same_v<T, mha::float16>) {
        return 2e-3;
    } else {
        return 1e-5;
    }
}

struct PagedCase {
    const char *name;
    int64_t heads, kv_heads, head_dim, value_dim, block_size;
    std::vector<int64_t> lengths;
    int64_t window_left = -1;
    double softcap = 0;
    bool alibi = false;
    int num_splits = 0;  // 0: chosen; a window or ALiBi runs one whatever is asked
};
const PagedCase kPagedCases[] = {
    {"one_sequence_d_64", 4, 4, 64, 64, 16, {100}},
    {"ragged_groups_of_4_d_128", 8, 2, 128, 128, 16, {1, 0, 300, 17, 64}},
    {"multi_query_d_17_dv_9_blocks_of_1", 3, 1, 17, 9, 1, {5, 40, 2}},
    {"d_256_blocks_of_64", 2, 1, 256, 256, 64, {130, 64}},
    {"window_d_80", 6, 3, 80, 80, 32, {200, 33, 5}, 50},
    {"softcap_alibi_d_96_groups_of_6", 12, 2, 96, 96, 16, {77, 150}, -1, 5.0, true},
    {"everything_d_72", 4, 2, 72, 72, 32, {90, 1, 260}, 40, 2.0, true},
    // Keys in splits merged by their log-sum-exp: splits of no keys, sequences shorter than one
    // split, more splits asked than blocks.
    {"3_splits_ragged_d_64", 8, 2, 64, 64, 16, {300, 0, 45, 129, 1}, -1, 0, false, 3},
    {"5_splits_softcap_multi_query_d_128", 4, 1, 128, 128, 32, {1000, 33}, -1, 3.0, false, 5},
    {"more_splits_than_blocks_d_32_dv_24", 2, 1, 32, 24, 64, {70}, -1, 0, false, 7},
    {"splits_asked_with_window_and_alibi", 4, 2, 72, 72, 32, {90, 260}, 40, 0, true, 4},
    // From 2,048 keys, grouped heads without a window or ALiBi run a task per sequence, every
    // key/value head inside each tile of keys: model and other head sizes, softcap, a window
    // that leaves no key out, sequences of none and of one key beside the long one.
    {"long_groups_of_4_d_128", 8, 2, 128, 128, 16, {2100, 0, 1, 333}},
    {"long_groups_of_3_d_72_dv_40_softcap", 6, 2, 72, 40, 32, {2049, 17}, 5000, 4.0},
    {"long_2_splits_groups_of_2_d_64", 4, 2, 64, 64, 64, {2500}, -1, 0, false, 2},
};

template <typename T>
void check_case(const PagedCase &c) {
    std::mt19937_64 rng(mha::testing::next_seed());
    const int64_t B = int64_t(c.lengths.size());
    int64_t blocks = 0, longest = 1;
    for (int64_t L : c.lengths) {
        blocks += (L + c.block_size - 1) / c.block_size;
        longest = std::max(longest, L);
    }
    const int64_t max_blocks = (longest + c.block_size - 1) / c.block_size + 1;
    PagedSequences<T> s(B, c.heads, c.kv_heads, c.head_dim, c.value_dim, blocks + 2 * B,
                        c.block_size, max_blocks);
    // Blocks out of order: each sequence grows in turns, a few tokens at a time.
    for (int64_t done = 0; done < longest; done += 7) {
        for (int64_t b = 0; b < B; b++) {
            s.append(b, std::clamp<int64_t>(c.lengths[size_t(b)] - done, 0, 7), rng);
        }
    }
    s.random_queries(rng);
    AttentionProblem options;
    options.window_left = c.window_left;
    options.softcap = c.softcap;
    mha::AttentionOptions run_options;
    run_options.window_left = c.window_left;
    run_options.softcap = float(c.softcap);
    run_options.num_splits = c.num_splits;
    if (c.alibi) {
        for (int64_t h = 0; h < c.heads; h++) {
            options.alibi_slopes.push_back(std::ldexp(1.0f, -int(h + 1)));
        }
        run_options.alibi_slopes =
            mha::StridedView<const float>{options.alibi_slopes.data(), {c.heads}, {}};
    }
    s.run(run_options);
    s.expect_reference(options, output_tolerance<T>());
}

class PagedAttention : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedAttention, EachSequenceMatchesItsReference) {
    for (mha::DType dtype : mha::contract::kDTypes) {
        SCOPED_TRACE(mha::contract::dtype_name(dtype));
        switch (dtype) {
        case mha::DType::f32:
            check_case<float>(GetParam());
            break;
        case mha::DType::bf16:
            check_case<mha::bfloat16>(GetParam());
            break;
        case mha::DType::f16:
            check_case<mha::float16>(GetParam());
            break;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Awkward, PagedAttention, ::testing::ValuesIn(kPagedCases),
                         [](const auto &info) { return std::string(info.param.name); });

// A server's life: 64 sequence slots over 1,000 steps. Each step ends some sequences (their
// blocks back in the pool), starts new ones with a prompt where the pool has room, appends one
// token to every live one, and runs one paged step over all 64 (ended slots have no keys); every
// sequence is checked against its reference. After warm-up the library allocates nothing in a
// step, and no block is ever lost: the free blocks and those the sequences hold add up to the
// pool, and all are free at the end.
TEST(PagedServing, SequencesComeAndGoWithoutMovingOrLeaking) {
    constexpr int64_t kSlots = 64, kSteps = 1000, kBlock = 16, kMaxBlocks = 8, kPool = 300;
    PagedSequences<float> s(kSlots, 4, 2, 16, 16, kPool, kBlock, kMaxBlocks);
    std::mt19937_64 rng(mha::testing::next_seed());
    const auto blocks_of = [&](int64_t length) {
        return (length + kBlock - 1) / kBlock;
    };
    size_t allocations_after_warm_up = 0;
    for (int64_t step = 0; step < kSteps; step++) {
        SCOPED_TRACE(::testing::Message() << "step " << step);
        for (int64_t b = 0; b < kSlots; b++) {
            const int64_t L = s.length(b);
            if (L > 0 && (rng() % 40 == 0 || L == kMaxBlocks * kBlock)) {
                s.end(b);
            } else if (L == 0 && rng() % 4 == 0) {
                const int64_t prompt = 1 + int64_t(rng() % 60);
                if (blocks_of(prompt + 1) <= s.tables().free_blocks()) {
                    s.append(b, prompt, rng);
                }
            }
        }
        const bool counted = step >= 10;
        if (counted) {
            mha::testing::start_counting_allocations();
        }
        for (int64_t b = 0; b < kSlots; b++) {
            const int64_t L = s.length(b);
            if (L > 0 && blocks_of(L + 1) - blocks_of(L) <= s.tables().free_blocks()) {
                s.append(b, 1, rng);
            }
        }
        s.random_queries(rng);
        s.run();
        if (counted) {
            allocations_after_warm_up += mha::testing::stop_counting_allocations();
        }
        int64_t held = 0;
        for (int64_t b = 0; b < kSlots; b++) {
            held += blocks_of(s.length(b));
        }
        ASSERT_EQ(held + s.tables().free_blocks(), kPool);
        if (step % 10 == 0 || step == kSteps - 1) {
            s.expect_reference({}, 1e-5);
        }
    }
    EXPECT_EQ(allocations_after_warm_up, 0u);
    for (int64_t b = 0; b < kSlots; b++) {
        s.end(b);
    }
    EXPECT_EQ(s.tables().free_blocks(), kPool);
}

// A split step's rows, tables and contexts come from the scratch pool: after a first step, it
// allocates nothing either. On one thread, as DecodeAllocations: on more, the blocks the pool's
// threads keep depend on how they interleaved the tasks.
TEST(PagedSplits, AllocateNothingAfterTheFirstStep) {
    mha::set_num_threads(1);
    PagedSequences<float> s(2, 8, 1, 64, 64, 140, 16, 70);
    std::mt19937_64 rng(mha::testing::next_seed());
    s.append(0, 1000, rng);
    s.append(1, 333, rng);
    s.random_queries(rng);
    s.split_keys(4);
    s.run();
    mha::testing::start_counting_allocations();
    s.run();
    EXPECT_EQ(mha::testing::stop_counting_allocations(), 0u);
    s.expect_reference({}, 1e-5);
    mha::set_num_threads(0);
}

TEST(PagedErrors, BadArgumentsNameThemselves) {
    PagedSequences<float> s(2, 4, 2, 16, 16, 8, 16, 4);
    std::mt19937_64 rng(mha::testing::next_seed());
    s.append(0, 20, rng);
    const auto expect_error = [](const auto &call, const char *message) {
        try {
            call();
            ADD_FAILURE() << "no error; expected " << message;
        } catch (const mha::Error &e) {
            EXPECT_STREQ(e.what(), message);
        }
    };
    expect_error([&] { s.tables().resize(0, 100); },
                 "sequence 0 of 100 keys: a sequence holds 0 to 64 (4 blocks of 16)");
    expect_error([&] { s.tables().resize(2, 1); }, "sequence 2: the tables hold sequences 0 to 1");
    expect_error([&] { s.tables().slot(0, 20); },
                 "key 20 of sequence 0: not held (the sequence has 20 keys)");
    expect_error([&] { mha::PagedBlockTables(8, 12, 2, 4); },
                 "paged block tables of 8 blocks of 12 slots, 2 sequences of up to 4 blocks: "
                 "each must be >= 1 (blocks, and the keys of a sequence, at most 2^31 - 1), the "
                 "block size a power of two");
    std::vector<float> q(2 * 4 * 16), out(2 * 4 * 16), cache(8 * 16 * 2 * 16);
    std::vector<int32_t> table{0, 1, 0, 0, 7, 9, 0, 0}, lengths{20, 17};
    const auto run = [&](std::vector<int64_t> query_shape, std::vector<int64_t> cache_shape,
                         const mha::AttentionOptions &options = {}) {
        const mha::PagedKvCache<float> paged{{cache.data(), cache_shape, {}},
                                             {cache.data(), cache_shape, {}},
                                             {table.data(), {2, 4}, {}},
                                             {lengths.data(), {2}, {}}};
        std::vector<int64_t> out_shape = query_shape;
        mha::paged_attention({q.data(), query_shape, {}}, paged, {out.data(), out_shape, {}},
                             options);
    };
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {8, 16, 2, 16});
        },
        "block_table[1][1] is 9: sequence 1 reads it, and the cache has blocks 0 to 7");
    table[5] = 3;
    expect_error(
        [&] {
            run({2, 2, 4, 16}, {8, 16, 2, 16});
        },
        "query has 2 positions per sequence: a paged step takes each sequence's newest "
        "token only");
    expect_error(
        [&] {
            run({2, 1, 3, 16}, {8, 16, 2, 16});
        },
        "query has 3 heads, not a multiple of key_cache's 2 (grouped-query heads share "
        "a key/value head)");
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {32, 4, 2, 16});
        },
        "sequence_lengths[0] is 20: must be 0 to max_blocks · block_size = 16");
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {2, 24, 4, 16});
        },
        "key_cache has blocks of 24 slots: a power of two (16, 32, 64...) is required");
    mha::AttentionOptions causal;
    causal.causal = mha::Causal::top_left;
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {8, 16, 2, 16}, causal);
        },
        "causal top_left with a paged step: the query is each sequence's last position "
        "(none or bottom_right)");
    mha::AttentionOptions splits;
    splits.num_splits = -2;
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {8, 16, 2, 16}, splits);
        },
        "num_splits -2 must be >= 0 (0: chosen)");
    splits.num_splits = 2;
    expect_error(
        [&] {
            using View = mha::StridedView<const float>;
            mha::attention(View{q.data(), {1, 4, 1, 16}, {}}, View{cache.data(), {1, 2, 4, 16}, {}},
                           View{cache.data(), {1, 2, 4, 16}, {}},
                           mha::StridedView<float>{out.data(), {1, 4, 1, 16}, {}}, splits);
        },
        "num_splits 2 is paged_attention's: other calls take 0");
    lengths[0] = -1;
    expect_error(
        [&] {
            run({2, 1, 4, 16}, {8, 16, 2, 16});
        },
        "sequence_lengths[0] is -1: must be 0 to max_blocks · block_size = 64");
}

}  // namespace
