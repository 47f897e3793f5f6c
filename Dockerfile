# The pgsse container image: one static binary and nothing else, run as an unprivileged user.
#
# Built by `make image` (scripts/image.sh), which prepares the build context: a static
# pgsse (CGO_ENABLED=0, stamped with its commit), an /etc/passwd and /etc/group naming the
# user, and the build host's CA certificates (for sslmode=verify-full to a managed
# PostgreSQL). Nothing is pulled: the base is scratch.
#
#   podman run --network host -e DATABASE_URL -e PGSSE_JWT_SECRET localhost/pgsse:latest
FROM scratch
COPY passwd /etc/passwd
COPY group /etc/group
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pgsse /usr/local/bin/pgsse
USER 65532:65532
# The admin endpoint (metrics, health) listens on every address of the container; publish
# it only where it should be reachable.
ENV PGSSE_ADMIN_LISTEN=:9090
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/pgsse"]
CMD ["serve"]
