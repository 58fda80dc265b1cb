"""Inside a sandbox without network: forward 127.0.0.1:PORT to the interception server's Unix socket.

An agent program speaks HTTP over TCP (OPENAI_BASE_URL=http://127.0.0.1:PORT/v1); the sandbox has
only its own loopback, and the interception socket is bind-mounted in. This script joins the two:

    python3 bridge.py SOCKET_PATH [PORT]     # prints "listening PORT", serves until killed

Standard library only, and no vf import: it runs with whatever python3 the sandbox has (copy this
file into the runtime's working directory, or bind it read-only). Bytes pass through unchanged;
the server still checks the rollout's key on every call.
"""

import asyncio
import sys

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF (passed on as a half-close); an error closes both sides."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
        peer.close()


async def serve(socket_path: str, port: int = 0) -> asyncio.AbstractServer:
    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, upstream_writer, writer),
                                 _pipe(upstream_reader, writer, upstream_writer))
        finally:
            writer.close()
            upstream_writer.close()

    return await asyncio.start_server(on_conn, "127.0.0.1", port)


async def main(socket_path: str, port: int) -> None:
    server = await serve(socket_path, port)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python3 bridge.py SOCKET_PATH [PORT]")
    try:
        asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 0))
    except KeyboardInterrupt:
        pass
