#include "test_seed.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <string>

namespace mha::testing {
namespace {

// MHA_TEST_SEED, else --gtest_random_seed when given, else fresh.
uint64_t choose_base_seed() {
    if (const char *text = std::getenv("MHA_TEST_SEED")) {
        char *end = nullptr;
        const unsigned long long seed = std::strtoull(text, &end, 10);
        if (end != text && *end == '\0') {
            return seed;
        }
        std::cerr << "MHA_TEST_SEED='" << text << "' is not a whole number\n";
        std::exit(2);
    }
    if (const int flag = GTEST_FLAG_GET(random_seed); flag != 0) {
        return uint64_t(flag);
    }
    return std::random_device{}();
}

uint64_t base_seed() {
    static const uint64_t seed = choose_base_seed();
    return seed;
}

std::string current_test() {
    const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
    return info == nullptr ? "" : std::string(info->test_suite_name()) + "." + info->name();
}

// splitmix64: well-spread seeds from consecutive inputs.
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Says how to replay a failed test.
class ReplayPrinter : public ::testing::EmptyTestEventListener {
    void OnTestEnd(const ::testing::TestInfo &info) override {
        if (info.result()->Failed()) {
            std::cout << "[ replay   ] MHA_TEST_SEED=" << base_seed() << " "
                      << ::testing::internal::GetArgvs()[0] << " --gtest_filter='"
                      << info.test_suite_name() << "." << info.name() << "'\n";
        }
    }
};

[[maybe_unused]] const bool registered = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new ReplayPrinter);
    return true;
}();

}  // namespace

uint64_t next_seed() {
    static std::map<std::string, uint64_t> calls;  // tests run one at a time
    const std::string test = current_test();
    return mix(base_seed() ^ std::hash<std::string>{}(test) ^ mix(calls[test]++));
}

}  // namespace mha::testing
