// Include Boost.Asio through here: Boost 1.74's awaitable.hpp uses std::exchange without
// including <utility>, which GCC 12 in C++20 mode rejects.
#pragma once

#include <utility>

#include <boost/asio.hpp>
