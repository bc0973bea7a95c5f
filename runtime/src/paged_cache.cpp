// A paged KV cache's writes (write_paged_cache) and its blocks given to sequences
// (PagedBlockTables): plain loops over the caller's memory, nothing allocated per call.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "checks.h"
#include "mha/mha.h"

namespace mha {
template <typename T>
void write_paged_cache(const StridedView<const T> &key, const StridedView<const T> &value,
                       const StridedView<T> &key_cache, const StridedView<T> &value_cache,
                       const StridedView<const int64_t> &slot_mapping) {
    detail::check_rank("key", key, 3, "[tokens, kv_heads, features]");
    detail::check_rank("value", value, 3, "[tokens, kv_heads, features]");
    const char *pages = "[num_blocks, block_size, kv_heads, features]";
    detail::check_rank("key_cache", key_cache, 4, pages);
    detail::check_rank("value_cache", value_cache, 4, pages);
    detail::check_rank("slot_mapping", slot_mapping, 1, "[tokens]");
    const int64_t tokens = key.shape[0], slots = key_cache.shape[0] * key_cache.shape[1];
    const std::array<std::pair<const char *, bool>, 4> agree = {{
        {"value", value.shape[0] == tokens && value.shape[1] == key.shape[1]},
        {"slot_mapping", slot_mapping.shape[0] == tokens},
        {"key_cache", key_cache.shape[2] == key.shape[1] && key_cache.shape[3] == key.shape[2]},
        {"value_cache",
         value_cache.shape[0] == key_cache.shape[0] && value_cache.shape[1] == key_cache.shape[1] &&
             value_cache.shape[2] == key.shape[1] && value_cache.shape[3] == value.shape[2]},
    }};
    for (const auto &[name, ok] : agree) {
        if (!ok) {
            throw Error(fmt::format(
                "{} does not fit key {}, value {}, key_cache {}, value_cache {}, slot_mapping {}",
                name, detail::shape_string(key.shape), detail::shape_string(value.shape),
                detail::shape_string(key_cache.shape), detail::shape_string(value_cache.shape),
                detail::shape_string(slot_mapping.shape)));
        }
    }
    const int64_t block_size = key_cache.shape[1];
    const int64_t slot_stride = detail::strides_of(slot_mapping)[0];
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t slot = slot_mapping.data[t * slot_stride];
        if (slot >= slots) {
            throw Error(fmt::format("slot_mapping[{}] is {}: the cache has slots 0 to {}", t, slot,
                                    slots - 1));
        }
    }
    const auto copy = [&](const StridedView<const T> &from, const StridedView<T> &to) {
        const std::array<int64_t, 4> in = detail::strides_of(from), out = detail::strides_of(to);
        for (int64_t t = 0; t < tokens; t++) {
            const int64_t slot = slot_mapping.data[t * slot_stride];
            if (slot < 0) {
                continue;  // a padding token
            }
            const int64_t block = slot / block_size, offset = slot % block_size;
            for (int64_t h = 0; h < from.shape[1]; h++) {
                const T *source = from.data + t * in[0] + h * in[1];
                T *target = to.data + block * out[0] + offset * out[1] + h * out[2];
                for (int64_t c = 0; c < from.shape[2]; c++) {
                    target[c * out[3]] = source[c * in[2]];
                }
            }
        }
    };
    copy(key, key_cache);
    copy(value, value_cache);
}

template void write_paged_cache(const StridedView<const float> &, const StridedView<const float> &,
                                const StridedView<float> &, const StridedView<float> &,
                                const StridedView<const int64_t> &);
template void write_paged_cache(const StridedView<const bfloat16> &,
                                const StridedView<const bfloat16> &, const StridedView<bfloat16> &,
                                const StridedView<bfloat16> &, const StridedView<const int64_t> &);
template void write_paged_cache(const StridedView<const float16> &,
                                const StridedView<const float16> &, const StridedView<float16> &,
                                const StridedView<float16> &, const StridedView<const int64_t> &);

PagedBlockTables::PagedBlockTables(int64_t num_blocks, int64_t block_size, int64_t max_sequences,
                                   int64_t max_blocks_per_sequence)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      max_sequences_(max_sequences),
      max_blocks_(max_blocks_per_sequence) {
    if (num_blocks < 1 || num_blocks > INT32_MAX || max_sequences < 1 ||
        max_blocks_per_sequence < 1 || block_size < 1 || (block_size & (block_size - 1)) != 0 ||
        max_blocks_per_sequence > INT32_MAX / block_size) {
        throw Error(
            fmt::format("paged block tables of {} blocks of {} slots, {} sequences of up "
                        "to {} blocks: each must be >= 1 (blocks, and the keys of a "
                        "sequence, at most 2^31 - 1), the block size a power of two",
                        num_blocks, block_size, max_sequences, max_blocks_per_sequence));
    }
    table_.assign(size_t(max_sequences * max_blocks_per_sequence), 0);
    lengths_.assign(size_t(max_sequences), 0);
    free_.resize(size_t(num_blocks));
    for (int64_t b = 0; b < num_blocks; b++) {
        free_[size_t(b)] = int32_t(num_blocks - 1 - b);  // block 0 on top
    }
}

void PagedBlockTables::resize(int64_t sequence, int64_t length) {
    if (sequence < 0 || sequence >= max_sequences_) {
        throw Error(fmt::format("sequence {}: the tables hold sequences 0 to {}", sequence,
                                max_sequences_ - 1));
    }
    if (length < 0 || length > max_blocks_ * block_size_) {
        throw Error(
            fmt::format("sequence {} of {} keys: a sequence holds 0 to {} ({} blocks of "
                        "{})",
                        sequence, length, max_blocks_ * block_size_, max_blocks_, block_size_));
    }
    const int64_t held = (lengths_[size_t(sequence)] + block_size_ - 1) / block_size_;
    const int64_t needed = (length + block_size_ - 1) / block_size_;
    if (needed - held > int64_t(free_.size())) {
        throw Error(fmt::format("sequence {} of {} keys needs {} more blocks; {} are free",
                                sequence, length, needed - held, free_.size()));
    }
    int32_t *row = table_.data() + sequence * max_blocks_;
    for (int64_t n = held; n < needed; n++) {
        row[n] = free_.back();
        free_.pop_back();
    }
    for (int64_t n = held; n-- > needed;) {
        free_.push_back(row[n]);  // within the capacity: every block started free
        row[n] = 0;
    }
    lengths_[size_t(sequence)] = int32_t(length);
}

int64_t PagedBlockTables::slot(int64_t sequence, int64_t position) const {
    if (sequence < 0 || sequence >= max_sequences_ || position < 0 ||
        position >= lengths_[size_t(sequence)]) {
        throw Error(fmt::format(
            "key {} of sequence {}: not held (the sequence has {} keys)", position, sequence,
            sequence >= 0 && sequence < max_sequences_ ? int64_t(lengths_[size_t(sequence)]) : 0));
    }
    return int64_t(table_[size_t(sequence * max_blocks_ + position / block_size_)]) * block_size_ +
           position % block_size_;
}

int64_t PagedBlockTables::length(int64_t sequence) const {
    if (sequence < 0 || sequence >= max_sequences_) {
        throw Error(fmt::format("sequence {}: the tables hold sequences 0 to {}", sequence,
                                max_sequences_ - 1));
    }
    return lengths_[size_t(sequence)];
}

int64_t PagedBlockTables::free_blocks() const { return int64_t(free_.size()); }

StridedView<const int32_t> PagedBlockTables::block_table() const {
    return {table_.data(), {max_sequences_, max_blocks_}, {}};
}

StridedView<const int32_t> PagedBlockTables::sequence_lengths() const {
    return {lengths_.data(), {max_sequences_}, {}};
}

}  // namespace mha
