// Links between the processes of one node: a Unix socket in a directory that
// only this user can enter, instead of TCP on loopback, which any local
// process of any user could reach. The kernel admits only this user's
// processes (the directory's mode, and each accepted peer's credentials are
// checked again), so nothing from another user reaches CAF's parser: not a
// message, not a handshake, not a header that sizes a buffer.
//
// CAF 0.17 carries its BASP over any stream socket: a middleman actor of our
// own (as CAF's OpenSSL module does for TLS) opens the Unix listener and
// connections and hands them to the same BASP broker that TCP links use, on
// the connection every link has (link_stream.hpp): what a process of this
// user sends is judged as a node's is (link_framing.hpp), and an accepted
// connection that does not finish its handshake within the deadline is shut.
#pragma once

#include "runtime/core/result.hpp"

#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace chorus::actors {

/// The directory of this user's sockets on this node. Every process of the
/// user that reads the same environment finds the same one:
///
///  - CHORUS_SOCKET_DIR (where `read_env`) names it: made with mode 0700
///    where missing, and used where it is a directory of this user's of mode
///    0700; any other directory (a shared one, like /tmp) holds it as its
///    subdirectory `chorus-<uid>`. A link there, or what is no directory, is
///    refused with the fix.
///  - Else `$XDG_RUNTIME_DIR/chorus`, where XDG_RUNTIME_DIR is a directory
///    of this user's of mode 0700.
///  - Else `$TMPDIR/chorus-<uid>` (an absolute TMPDIR), else
///    `/tmp/chorus-<uid>`.
///
/// Such a subdirectory is made with mode 0700 where missing, and used where
/// lstat finds it a directory of this user's of mode 0700. One that is not
/// (another user's, a link, another mode) is left as it is, and the first of
/// `<name>-1`, `<name>-2`, ... that is, or can be made so, is taken instead.
/// No directory that chorus did not make has its mode changed.
[[nodiscard]] Result<std::string> local_socket_dir(bool read_env);

/// The socket of the run or group that `port` names on this node.
[[nodiscard]] std::string local_socket_path(const std::string& dir, std::uint16_t port);

/// A middleman actor (CAF's publish_atom and connect_atom) whose listeners
/// and connections are the Unix sockets of `dir`, keyed by port.
/// `handshake_deadline`: how long an accepted connection has to prove itself.
caf::io::middleman_actor spawn_local_links(caf::actor_system& sys, std::string dir,
                                           std::chrono::milliseconds handshake_deadline);

} // namespace chorus::actors
