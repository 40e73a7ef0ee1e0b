// Asio is compiled once, here (ASIO_SEPARATE_COMPILATION is defined project-wide).
#include <asio/impl/src.hpp>
#include <asio/ssl/impl/src.hpp>
