// The REST API's JSON writer: common/json.h, under the server's namespace.
#pragma once

#include "common/json.h"

namespace strata::server {

using strata::json_num;
using strata::json_str;

}  // namespace strata::server
