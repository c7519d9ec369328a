# The operator image the chart runs. (Not built in CI here: this machine has no container engine.)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sovereignspec ./sovereignspec
COPY profiles ./profiles
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# Non-root, as the chart's restricted security context requires; the root filesystem can be
# read-only (the operator writes nothing but /tmp, an emptyDir in the chart).
USER 65532:65532
ENTRYPOINT ["sovereignspec"]
CMD ["operator"]
