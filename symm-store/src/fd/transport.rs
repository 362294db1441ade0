//! The wire: connecting to a peer's abstract socket, sending one header with its descriptors
//! (SCM_RIGHTS), reading the verdict, and receiving and checking a message.

use super::*;

impl FdChannel {
    /// Connects to `to` and sends one header with `fds`; returns the connection for the ack.
    pub(super) fn send_message(
        &self,
        to: usize,
        gen: u64,
        fds: &[RawFd],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<UnixStream> {
        let peer = &self.peers[to];
        let conn = connect_abstract(&peer.name, deadline).map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => StoreError::PeerLost {
                rank: to,
                reason: format!("its fd socket is gone ({e}); process {} exited?", peer.pid),
            },
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::MissingRanks {
                what: format!("fd send to rank {to}"),
                missing: vec![to],
                timeout,
            },
            _ => io_err(&format!("connect to rank {to}"), e),
        })?;
        // The listener's credentials are those of the process that created it.
        let cred = socket::getsockopt(&conn, sockopt::PeerCredentials).map_err(|e| io_err("SO_PEERCRED", e.into()))?;
        if cred.pid() != peer.pid || cred.uid() != peer.uid {
            return Err(StoreError::BadFdMessage(format!(
                "socket of rank {to} is owned by pid {} uid {}, expected pid {} uid {}",
                cred.pid(),
                cred.uid(),
                peer.pid,
                peer.uid
            )));
        }
        let header = encode_header(gen, self.rank, to);
        let iov = [IoSlice::new(&header)];
        let cmsgs = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsgs };
        let sent = loop {
            match socket::sendmsg::<()>(conn.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
                Err(Errno::EINTR) => continue,
                Err(e @ (Errno::EPIPE | Errno::ECONNRESET)) => {
                    return Err(StoreError::PeerLost {
                        rank: to,
                        reason: format!("sending fd: {e}"),
                    })
                }
                Err(e) => return Err(io_err(&format!("sendmsg to rank {to}"), e.into())),
                Ok(n) => break n,
            }
        };
        if sent != HEADER_LEN {
            return Err(StoreError::Io(io::Error::other(format!(
                "fd channel: short send to rank {to}: {sent} bytes"
            ))));
        }
        Ok(conn)
    }

    /// Waits for the receiver's verdict on a message sent over `conn`.
    pub(super) fn read_ack(
        &self,
        to: usize,
        mut conn: UnixStream,
        gen: u64,
        deadline: Instant,
        timeout: Duration,
        what: &str,
    ) -> Result<()> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::MissingRanks {
                    what: format!("{what}: rank {to} did not take our fd"),
                    missing: vec![to],
                    timeout,
                });
            }
            let ready = readable_within(conn.as_fd(), left.min(POLL_SLICE)).map_err(|e| io_err("poll", e.into()))?;
            if !ready {
                if let Some(e) = self.peer_abort(gen) {
                    return Err(e);
                }
                if !pid_alive(self.peers[to].pid) {
                    return Err(StoreError::PeerLost {
                        rank: to,
                        reason: format!("process {} exited before taking our fd", self.peers[to].pid),
                    });
                }
                continue;
            }
            let mut b = [0u8; 1];
            return match conn.read(&mut b) {
                Ok(0) => Err(StoreError::PeerLost {
                    rank: to,
                    reason: "closed the connection before answering".into(),
                }),
                Ok(_) if b[0] == ACK_OK => Ok(()),
                Ok(_) => Err(StoreError::BadFdMessage(format!(
                    "rank {to} rejected our fd message ({what})"
                ))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => Err(StoreError::PeerLost {
                    rank: to,
                    reason: format!("reading its answer: {e}"),
                }),
            };
        }
    }

    /// Accepts messages until one fd of generation `gen` arrived from each rank of `from`.
    pub(super) fn receive(
        &self,
        st: &mut OpState,
        gen: u64,
        from: &[usize],
        deadline: Instant,
        timeout: Duration,
        what: &str,
    ) -> Result<HashMap<usize, OwnedFd>> {
        let mut got = HashMap::new();
        // Early messages of generations that are over can no longer be used.
        st.pending.retain(|(g, _), _| *g >= gen);
        for &r in from {
            if let Some(fd) = st.pending.remove(&(gen, r)) {
                got.insert(r, fd);
            }
        }
        let mut rejected: Vec<String> = Vec::new();
        loop {
            let missing: Vec<usize> = from.iter().copied().filter(|r| !got.contains_key(r)).collect();
            if missing.is_empty() {
                return Ok(got);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let mut what = format!("{what} (generation {gen})");
                if !rejected.is_empty() {
                    what.push_str(&format!("; rejected messages: {}", rejected.join("; ")));
                }
                return Err(StoreError::MissingRanks { what, missing, timeout });
            }
            let ready =
                readable_within(self.listener.as_fd(), left.min(POLL_SLICE)).map_err(|e| io_err("poll", e.into()))?;
            if !ready {
                if let Some(e) = self.peer_abort(gen) {
                    return Err(e);
                }
                for &r in &missing {
                    if !pid_alive(self.peers[r].pid) {
                        return Err(StoreError::PeerLost {
                            rank: r,
                            reason: format!("process {} exited before sending its fd ({what})", self.peers[r].pid),
                        });
                    }
                }
                continue;
            }
            let conn = match self.listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("accept", e)),
            };
            match self.take_message(&conn, deadline) {
                Ok((mgen, mfrom, fd)) => {
                    let verdict = if mgen == gen && from.contains(&mfrom) && !got.contains_key(&mfrom) {
                        got.insert(mfrom, fd);
                        Ok(())
                    } else if mgen > gen
                        && mgen - gen <= MAX_GENERATIONS_AHEAD
                        && !st.pending.contains_key(&(mgen, mfrom))
                    {
                        st.pending.insert((mgen, mfrom), fd);
                        Ok(())
                    } else if mgen == gen {
                        Err(Reject {
                            reason: format!("rank {mfrom} sent an fd that {what} does not expect from it"),
                            fatal_rank: (!got.contains_key(&mfrom)).then_some(mfrom),
                            exhausted: false,
                        })
                    } else {
                        Err(Reject {
                            reason: format!(
                                "rank {mfrom} sent generation {mgen}, expected {gen} (stale, duplicate or too far ahead)"
                            ),
                            fatal_rank: None,
                            exhausted: false,
                        })
                    };
                    match verdict {
                        Ok(()) => send_ack(&conn, ACK_OK),
                        Err(rej) => {
                            send_ack(&conn, ACK_REJECT);
                            if rej.fatal_rank.is_some() {
                                return Err(StoreError::BadFdMessage(format!("{what}: {}", rej.reason)));
                            }
                            rejected.push(rej.reason);
                        }
                    }
                }
                Err(rej) => {
                    send_ack(&conn, ACK_REJECT);
                    if rej.exhausted {
                        return Err(exhausted(&format!("{what}: receiving an fd: {}", rej.reason)));
                    }
                    if rej.fatal_rank.is_some() {
                        return Err(StoreError::BadFdMessage(format!("{what}: {}", rej.reason)));
                    }
                    rejected.push(rej.reason);
                }
            }
        }
    }

    /// Reads and validates one message from an accepted connection.
    pub(super) fn take_message(
        &self,
        conn: &UnixStream,
        deadline: Instant,
    ) -> std::result::Result<(u64, usize, OwnedFd), Reject> {
        let plain = |reason: String| Reject {
            reason,
            fatal_rank: None,
            exhausted: false,
        };
        let cred = socket::getsockopt(conn, sockopt::PeerCredentials)
            .map_err(|e| plain(format!("SO_PEERCRED failed: {e}")))?;
        // Some rank whose published credentials this connection has, if any.
        let sender = self
            .peers
            .iter()
            .position(|p| p.pid == cred.pid() && p.uid == cred.uid());
        let conn_deadline = deadline.min(deadline_after(CONN_READ_LIMIT));
        let mut header = [0u8; HEADER_LEN];
        let mut have = 0usize;
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut truncated = false;
        let mut other_cmsgs = 0usize;
        while have < HEADER_LEN {
            let left = conn_deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(plain(format!(
                    "pid {} sent only {have} of {HEADER_LEN} header bytes in time",
                    cred.pid()
                )));
            }
            let ready = readable_within(conn.as_fd(), left).map_err(|e| plain(format!("poll: {e}")))?;
            if !ready {
                continue;
            }
            match sys::recv_with_fds(conn.as_fd(), &mut header[have..]) {
                Ok(r) => {
                    truncated |= r.truncated;
                    other_cmsgs += r.other_cmsgs;
                    fds.extend(r.fds);
                    if r.bytes == 0 {
                        break;
                    }
                    have += r.bytes;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Reject {
                        reason: format!("recvmsg from pid {}: {e}", cred.pid()),
                        fatal_rank: sender,
                        exhausted: crate::util::is_fd_exhaustion(&e),
                    })
                }
            }
        }
        let cred_who = |r: Option<usize>| match r {
            Some(r) => format!("rank {r} (pid {})", cred.pid()),
            None => format!("pid {} uid {} (not a rank of this channel)", cred.pid(), cred.uid()),
        };
        // From here on, `fds` are closed on every early return.
        if truncated {
            // The kernel truncates SCM_RIGHTS when it cannot install the fds here.
            let ours = fds.is_empty();
            return Err(Reject {
                reason: format!(
                    "{}: control data truncated (MSG_CTRUNC), {} fd(s) arrived",
                    cred_who(sender),
                    fds.len()
                ),
                fatal_rank: sender,
                exhausted: ours && sender.is_some(),
            });
        }
        let decoded = if have == HEADER_LEN {
            decode_header(&header)
        } else {
            None
        };
        let Some((gen, from, to)) = decoded else {
            return Err(Reject {
                reason: format!(
                    "{}: malformed header ({have} bytes); {} fd(s) closed",
                    cred_who(sender),
                    fds.len()
                ),
                fatal_rank: sender,
                exhausted: false,
            });
        };
        let genuine = self
            .peers
            .get(from)
            .is_some_and(|p| p.pid == cred.pid() && p.uid == cred.uid());
        if !genuine {
            return Err(plain(format!(
                "{} claims to be rank {from}, credentials do not match; {} fd(s) closed",
                cred_who(sender),
                fds.len()
            )));
        }
        let sender = from;
        let who = format!("rank {from} (pid {})", cred.pid());
        if to != self.rank {
            return Err(Reject {
                reason: format!("{who}: message addressed to rank {to}, this is rank {}", self.rank),
                fatal_rank: Some(sender),
                exhausted: false,
            });
        }
        if other_cmsgs != 0 {
            return Err(Reject {
                reason: format!("{who}: unexpected control messages ({other_cmsgs})"),
                fatal_rank: Some(sender),
                exhausted: false,
            });
        }
        if fds.len() != 1 {
            return Err(Reject {
                reason: format!("{who}: sent {} fds (exactly one allowed); closed them", fds.len()),
                fatal_rank: Some(sender),
                exhausted: false,
            });
        }
        let fd = fds.remove(0);
        if let Err(reason) = check_kind(fd.as_fd(), self.expect) {
            return Err(Reject {
                reason: format!("{who}: {reason}"),
                fatal_rank: Some(sender),
                exhausted: false,
            });
        }
        Ok((gen, from, fd))
    }
}

/// Best-effort one-byte verdict to the sender (it may be gone).
fn send_ack(mut conn: &UnixStream, b: u8) {
    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = conn.write(&[b]);
}

/// Connects to an abstract unix socket with the connect bounded by `deadline`
/// (a full backlog otherwise blocks without limit).
fn connect_abstract(name: &str, deadline: Instant) -> io::Result<UnixStream> {
    let fd = socket::socket(
        socket::AddressFamily::Unix,
        socket::SockType::Stream,
        socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let tv = nix::sys::time::TimeVal::new(
        i64::try_from(left.as_secs()).unwrap_or(i64::MAX) as _,
        left.subsec_micros() as _,
    );
    socket::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(io::Error::from)?;
    let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(io::Error::from)?;
    loop {
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(UnixStream::from(fd))
}
