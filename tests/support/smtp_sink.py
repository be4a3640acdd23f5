#!/usr/bin/env python3
"""A real SMTP server on loopback for the alert tests (Debian's python3-aiosmtpd).

Usage: smtp_sink.py PORT OUTDIR [--tls CERT KEY] [--auth USER PASSWORD] [--reject ADDR] [--defer ADDR]

Every message it accepts is written to OUTDIR/N.eml, its envelope's
recipients to OUTDIR/N.rcpt (one per line). With --reject it answers 550
to RCPT TO:<ADDR> (with a text that says "authorized", as a relay refusal
does); with --defer, 452 (a mailbox that is full, for now). With --tls it offers
STARTTLS and requires it before MAIL; with --auth it requires a login with
that user and password. Prints "ready" once listening; runs until killed.
"""
import os
import ssl
import sys
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Sink:
    def __init__(self, outdir, reject=None, defer=None):
        self.outdir = outdir
        self.reject = reject
        self.defer = defer
        self.n = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address == self.reject:
            return "550 5.7.1 relaying to this address not authorized"
        if address == self.defer:
            return "452 4.2.2 mailbox full"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.n += 1
        path = os.path.join(self.outdir, f"{self.n}.eml")
        with open(path + ".tmp", "wb") as f:
            f.write(envelope.original_content or envelope.content)
        with open(os.path.join(self.outdir, f"{self.n}.rcpt"), "w") as f:
            f.write("\n".join(envelope.rcpt_tos) + "\n")
        os.rename(path + ".tmp", path)
        return "250 OK stored as %d" % self.n


def main():
    port, outdir = int(sys.argv[1]), sys.argv[2]
    args = sys.argv[3:]
    kw = {}
    if "--tls" in args:
        i = args.index("--tls")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args[i + 1], args[i + 2])
        kw["tls_context"] = ctx
        kw["require_starttls"] = True
    if "--auth" in args:
        i = args.index("--auth")
        user, password = args[i + 1].encode(), args[i + 2].encode()

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = isinstance(auth_data, LoginPassword) and auth_data.login == user and auth_data.password == password
            # handled=False: let aiosmtpd answer 535 itself on failure.
            return AuthResult(success=ok, handled=False)

        kw["authenticator"] = authenticator
        kw["auth_required"] = True
        kw["auth_require_tls"] = "--tls" in args
    reject = args[args.index("--reject") + 1] if "--reject" in args else None
    defer = args[args.index("--defer") + 1] if "--defer" in args else None
    c = Controller(Sink(outdir, reject, defer), hostname="127.0.0.1", port=port, server_hostname="localhost", **kw)
    c.start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
