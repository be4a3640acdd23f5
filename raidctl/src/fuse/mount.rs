//! Mounting a FUSE filesystem: as root, the mount system call with a
//! `/dev/fuse` descriptor; otherwise through `fusermount3`, the setuid
//! helper of the fuse3 package, which mounts and hands the descriptor back
//! over a Unix socket (what libfuse does).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Mounts an empty FUSE filesystem named `fsname` on `dir`; returns the
/// connection's descriptor (requests arrive on it from now on).
pub fn mount(dir: &Path, fsname: &str) -> io::Result<File> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount(dir, fsname);
    }
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let c = |s: &str| CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let target = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let source = c(fsname)?;
    let opts = c(&format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fd.as_raw_fd()
    ))?;
    for fstype in ["fuse.raidctl", "fuse"] {
        let t = c(fstype)?;
        // SAFETY: every pointer is a NUL-terminated string that lives
        // across the call; mount(2) only reads them.
        let r = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                t.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if r == 0 {
            return Ok(fd);
        }
        let e = io::Error::last_os_error();
        // An older kernel without fs subtypes: plain "fuse".
        if e.raw_os_error() != Some(libc::ENODEV) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENODEV))
}

/// `fusermount3 -o fsname=NAME -- DIR` with `_FUSE_COMMFD` naming our end
/// of a socket pair, on which it sends the descriptor.
fn fusermount(dir: &Path, fsname: &str) -> io::Result<File> {
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = UnixStream::pair()?;
    let child_fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new("fusermount3");
    // Only the child inherits its end: close-on-exec is cleared after the
    // fork, so no other child of this (threaded) daemon gets it. Without
    // allow_other, which fusermount3 grants users only where
    // /etc/fuse.conf says user_allow_other.
    // SAFETY: the closure only calls fcntl on an fd this process owns,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let fl = libc::fcntl(child_fd, libc::F_GETFD);
            if libc::fcntl(child_fd, libc::F_SETFD, fl & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let fsname: String = fsname.chars().filter(|c| *c != ',' && *c != '\\').collect();
    let status = cmd
        .env("_FUSE_COMMFD", child_fd.to_string())
        .arg("-o")
        .arg(format!(
            "fsname={fsname},subtype=raidctl,default_permissions"
        ))
        .arg("--")
        .arg(dir)
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e} (package fuse3)")))?;
    drop(theirs);
    if !status.success() {
        return Err(io::Error::other(format!("fusermount3 failed ({status})")));
    }
    recv_fd(&ours).map(super::session::file_from_raw)
}

/// Receives one descriptor sent with SCM_RIGHTS.
fn recv_fd(s: &std::os::unix::net::UnixStream) -> io::Result<i32> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one control message carrying one int.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below points into
    // locals that outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `msg` describes valid buffers (above). The descriptor
    // arrives close-on-exec: no later child inherits it.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("fusermount3's message was truncated"));
    }
    // SAFETY: CMSG_FIRSTHDR returns null or a header inside the control
    // buffer recvmsg filled (msg_controllen); its length is checked to hold
    // one int before CMSG_DATA is read.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null()
            || (*c).cmsg_level != libc::SOL_SOCKET
            || (*c).cmsg_type != libc::SCM_RIGHTS
            || ((*c).cmsg_len as usize) < libc::CMSG_LEN(4) as usize
        {
            return Err(io::Error::other("fusermount3 sent no descriptor"));
        }
        Ok(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32))
    }
}

/// Unmounts (not lazily: busy is an error); without root, through
/// `fusermount3 -u`.
pub fn umount(dir: &Path) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated path that lives across the call;
    // umount2 reads it and nothing else.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    // Unmounted already (by an administrator): nothing left to do.
    if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) && !is_mounted(dir) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if e.raw_os_error() == Some(libc::EPERM) && unsafe { libc::geteuid() } != 0 {
        let out = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(dir)
            .output()?;
        if out.status.success() {
            return Ok(());
        }
        return Err(io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Err(e)
}

/// Detaches the mount now; the kernel finishes it when the last user lets
/// go.
pub fn umount_lazy(dir: &Path) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: as in `umount`.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `dir` is a mount point now (from /proc/self/mountinfo).
pub(super) fn is_mounted(dir: &Path) -> bool {
    super::place::top_mount(dir).is_some()
}
