// The owner of a message body that is written from where it is rather than copied
// (batched_comm::send with a keeper, docs/design.md 5.3).
#pragma once

namespace ordo {

/// Keeps a body's bytes where they are, unchanged, until it is destroyed: once the body has been
/// written, or once its connection has ended without it (then on the connection's executor),
/// or at once where the body was copied after all.
class held_body {
  public:
    virtual ~held_body() = default;
};

}  // namespace ordo
