import psycopg
from psycopg import sql


class PsycopgSession:
    """The application's own LISTEN session for pgsse_hub.Failover, over psycopg 3."""

    def __init__(self, dsn):
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="worker-listen")
        self.got = []  # notifications psycopg read while running a LISTEN
        self.conn.add_notify_handler(lambda n: self.got.append((n.channel, n.payload, n.pid)))

    def fileno(self):
        return self.conn.fileno()

    def listen(self, channel):
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def unlisten(self, channel):
        self.conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))

    def notifications(self):
        pg = self.conn.pgconn
        pg.consume_input()  # raises once the connection is lost
        while (n := pg.notifies()) is not None:
            self.got.append((n.relname.decode(), n.extra, n.be_pid))
        got, self.got = self.got, []
        return got

    def close(self):
        self.conn.close()
