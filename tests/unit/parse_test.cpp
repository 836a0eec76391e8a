// Parsers of names and numbers that the watched processes and /proc hand the agent never throw:
// each overflow, empty or foreign text below is answered with "not a number", not an exception
// that would end the agent (std::stoi did, on an interpreter named python3.99999999999).
#include "common/parse.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "agent/os/proc_readers.h"
#include "unwind/python_runtime.h"

namespace strata {
namespace {

TEST(Parse, WholeIntegersOnly) {
  EXPECT_EQ(parse_int<int>("42"), 42);
  EXPECT_EQ(parse_int<int>("-3"), -3);
  EXPECT_EQ(parse_int<uint64_t>("ff", 16), 255u);
  EXPECT_FALSE(parse_int<int>(""));
  EXPECT_FALSE(parse_int<int>("99999999999")) << "overflow";
  EXPECT_FALSE(parse_int<uint32_t>("-1")) << "no sign for unsigned";
  EXPECT_FALSE(parse_int<int>("12abc"));
  EXPECT_FALSE(parse_int<int>(" 12"));
  EXPECT_FALSE(parse_int<uint64_t>("18446744073709551616")) << "2^64";
  EXPECT_EQ(parse_int<uint64_t>("18446744073709551615"), UINT64_MAX);
}

TEST(Parse, LeadingIntegers) {
  size_t used = 0;
  EXPECT_EQ(parse_int_prefix<int>("  123 kB", 10, &used), 123);
  EXPECT_EQ(used, 5u);
  EXPECT_EQ(parse_int_prefix<uint64_t>("\t000001ffffffffff\n", 16), 0x1ffffffffffull);
  EXPECT_EQ(parse_int_prefix<uint64_t>("8123]"), 8123u);
  EXPECT_FALSE(parse_int_prefix<int>("kB"));
  EXPECT_FALSE(parse_int_prefix<int>(""));
  EXPECT_FALSE(parse_int_prefix<int>("99999999999999999999 x"));
}

TEST(Parse, Doubles) {
  EXPECT_EQ(parse_double("1.5"), 1.5);
  EXPECT_FALSE(parse_double(""));
  EXPECT_FALSE(parse_double("1.5s"));
  EXPECT_FALSE(parse_double("."));
  auto big = parse_double("1" + std::string(400, '0'));  // out of range for a double
  EXPECT_FALSE(big);
}

TEST(Parse, InterpreterNamesChosenByTheTarget) {
  EXPECT_EQ(unwind::python_minor_from_path("/usr/bin/python3.11"), 11);
  EXPECT_EQ(unwind::python_minor_from_path("/usr/lib/libpython3.12.so.1.0"), 12);
  EXPECT_FALSE(unwind::python_minor_from_path("/opt/python3.99999999999"));
  EXPECT_FALSE(unwind::python_minor_from_path("/opt/libpython3.99999999999999999999.so"));
  EXPECT_FALSE(unwind::python_minor_from_path("/opt/python3.9"));
}

TEST(Parse, ProcFilesWithNumbersTooBig) {
  // Fields 10 and 12 (minor and major faults) out of range of 64 bits.
  EXPECT_FALSE(agent::os::parse_proc_stat_faults(
      "1 (x) S 1 1 1 0 -1 0 99999999999999999999999 0 5 0 0 0 0 0 20 0 1 0 1 1 1"));
  auto irqs = agent::os::parse_irq_names(" 99999999999: 1 2 IO-APIC eth0\n 5: 1 2 IO-APIC ata\n");
  EXPECT_EQ(irqs.size(), 1u);
  EXPECT_EQ(irqs[5], "ata");
}

}  // namespace
}  // namespace strata
