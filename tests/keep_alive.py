"""One keep-alive connection, idle between two requests: whether the server still answers on it (the servers'
--timeout-keep-alive, fastdeploy/http/sockets.py)."""
from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

# past uvicorn's own 5 s default and the 5 s pool expiry of httpx (so of the OpenAI SDK)
IDLE_S = 6.0


def statuses_over_one_idle_connection(url: str, path: str, headers: dict[str, str], idle_s: float = IDLE_S
                                      ) -> tuple[int, int]:
    """The two requests' statuses, both sent on one TCP connection with `idle_s` between them. http.client never
    reconnects by itself: had the server closed the connection, the second request raises RemoteDisconnected."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        statuses = []
        for index in range(2):
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
            if index == 0:
                first_socket = connection.sock
                time.sleep(idle_s)
        assert connection.sock is first_socket, "the connection was reopened"
        return statuses[0], statuses[1]
    finally:
        connection.close()
