"""A pure-asyncio msgpack-rpc client: the baseline a Python user writes without ordo. One
connection, requests [0, id, method, params] written as they are made, responses matched by id
by one reader task. No ordering promise beyond TCP's, no resume, no streams."""
import asyncio
import itertools

import msgpack


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.ids = itertools.count()
        self.pending: dict = {}
        self.task = asyncio.ensure_future(self._read())
        self.pack = msgpack.Packer(use_bin_type=True).pack

    @classmethod
    async def connect(cls, host: str, port: int) -> "Client":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def call(self, method: str, *args):
        msgid = next(self.ids) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self.pending[msgid] = fut
        self.writer.write(self.pack([0, msgid, method, list(args)]))
        return fut

    async def _read(self) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                break
            unpacker.feed(data)
            for _, msgid, error, result in unpacker:
                fut = self.pending.pop(msgid)
                if error is not None:
                    fut.set_exception(RuntimeError(str(error)))
                else:
                    fut.set_result(result)
        for fut in self.pending.values():
            fut.set_exception(ConnectionError("connection closed"))

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()
