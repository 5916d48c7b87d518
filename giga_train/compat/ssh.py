"""ssh_copy_id: let the machines of a multi-node job log into each other without a password.

GigaTrain's call form `ssh_copy_id(ips, username, password, port)`. Over a password login to each
machine (paramiko, imported only when called: `pip install paramiko`), it makes sure each has a key
pair (~/.ssh/id_rsa, generated when missing), adds every machine's public key to every machine's
~/.ssh/authorized_keys (once; the keys already there are kept) and every machine's host key to
every machine's ~/.ssh/known_hosts, so that each can reach all the others (and itself) by key.
GigaTrain's version assumes a folder shared by all machines and root's ~/.ssh, and replaces
authorized_keys; this one needs neither and replaces nothing."""
import shlex


def _connect(ip, username, password, port):
    try:
        import paramiko
    except ImportError:
        raise ImportError("ssh_copy_id needs paramiko: pip install paramiko") from None
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(ip, port=port, username=username, password=password, look_for_keys=False,
                   allow_agent=False)
    return client


def _run(client, ip, command):
    """Run `command` on one machine; its stdout, or RuntimeError with its stderr."""
    _, stdout, stderr = client.exec_command(command)
    out = stdout.read().decode()
    if stdout.channel.recv_exit_status() != 0:
        raise RuntimeError(f"ssh_copy_id: on {ip}: `{command}` failed: {stderr.read().decode().strip()}")
    return out


def ssh_copy_id(ips, username, password, port) -> None:
    """Make every machine in `ips` able to `ssh -p port username@ip` into every other, by key."""
    ips = [ips] if isinstance(ips, str) else list(ips)
    clients = [_connect(ip, username, password, port) for ip in ips]
    try:
        keys = []
        for ip, client in zip(ips, clients):
            key = _run(client, ip, 'mkdir -p ~/.ssh && chmod 700 ~/.ssh && '
                                   '{ test -f ~/.ssh/id_rsa.pub || ssh-keygen -q -t rsa -N "" -f ~/.ssh/id_rsa; } && '
                                   'cat ~/.ssh/id_rsa.pub').strip()
            if key and key not in keys:
                keys.append(key)
            print(ip, key.split(" ")[-1] if key else "(no key)")
        add_keys = " && ".join(
            f"{{ grep -qxF {shlex.quote(k)} ~/.ssh/authorized_keys 2>/dev/null || "
            f"echo {shlex.quote(k)} >> ~/.ssh/authorized_keys; }}" for k in keys)
        scan = " ; ".join(f"ssh-keyscan -p {int(port)} {shlex.quote(ip)} 2>/dev/null >> ~/.ssh/known_hosts"
                          for ip in ips)
        for ip, client in zip(ips, clients):
            _run(client, ip, f"{add_keys} && chmod 600 ~/.ssh/authorized_keys")
            _run(client, ip, f"{scan} ; sort -u -o ~/.ssh/known_hosts ~/.ssh/known_hosts")
            print(ip, f"authorized {len(keys)} key(s)")
    finally:
        for client in clients:
            client.close()
