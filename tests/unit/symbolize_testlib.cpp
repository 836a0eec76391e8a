// Read as a file by symbolize_test (and dlopen'ed there to learn its addresses): functions whose
// names, kinds and source lines the test knows. Keep the marker comments on their lines.
#include <cstdint>

namespace strata_testlib {

class Widget {
 public:
  int compute(int x) const;
};

__attribute__((noinline)) int Widget::compute(int x) const {  // MARK:compute
  return x * 3 + 1;
}

}  // namespace strata_testlib

// Local: present in .symtab only, so it disappears when the file is stripped.
__attribute__((noinline)) static int local_helper(int x) {  // MARK:local_helper
  return x * x + 7;
}

// A symbol without a size (as hand-written assembly often has): covers up to the next symbol.
asm(".text\n"
    ".globl strata_testlib_nosize\n"
    ".type strata_testlib_nosize, @function\n"
    "strata_testlib_nosize:\n"
    "  nop\n  nop\n  nop\n  nop\n"
    "  ret\n");

extern "C" {

__attribute__((noinline)) int strata_testlib_exported(int x) {
  strata_testlib::Widget w;
  return local_helper(x) + w.compute(x);
}

// The test cannot dlsym a local function; this hands out its address.
uintptr_t strata_testlib_local_helper_address() { return reinterpret_cast<uintptr_t>(&local_helper); }

}  // extern "C"
