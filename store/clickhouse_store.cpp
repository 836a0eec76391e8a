#include "store/store.h"

namespace strata::store {

Result<std::unique_ptr<Store>> Store::open_clickhouse(const std::string& url, Mode) {
  return Error{"--store " + url + ": ClickHouse support is not built yet"};
}

}  // namespace strata::store
