// What a failed HTTP request (cpp-httplib) means, in words: httplib's own names ("Connection",
// "Read") read like a message cut short.
#pragma once

#include <httplib.h>

#include <string>

namespace strata {

inline std::string http_error_text(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection failed (refused, or no route to the host: is it running and listening there?)";
    case httplib::Error::ConnectionTimeout: return "no answer to the connection attempt in time";
    case httplib::Error::Read: return "the connection broke or timed out while reading the answer";
    case httplib::Error::Write: return "the connection broke while sending the request";
    case httplib::Error::BindIPAddress: return "cannot bind the local address";
    case httplib::Error::ExceedRedirectCount: return "too many redirects";
    case httplib::Error::Canceled: return "the request was canceled";
    case httplib::Error::Compression: return "the answer's compression is broken";
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification: return "TLS failed (" + httplib::to_string(e) + ")";
    default: return "request failed (" + httplib::to_string(e) + ")";
  }
}

}  // namespace strata
