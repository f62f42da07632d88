# kvd container image: CPU backend, stories260K baked in (deploy/README.md).
#   docker build -t kvd:latest .
#   docker run --rm --stop-timeout 45 -p 50051:50051 -p 50052:50052 kvd:latest
# (--stop-timeout: the drain on SIGTERM takes up to 30 s + 10 s; docker's default kills at 10.)
# The build stage needs network access (Debian packages; the model from Hugging Face).

# ---- build: Debian 12 with the packages `make build` installs ----------------------------
# (scripts/install-deps without --test: no tests run here, so no Python or Prometheus.)
FROM debian:12 AS build
WORKDIR /src
COPY scripts/ scripts/
RUN scripts/install-deps && rm -rf /var/lib/apt/lists/*

COPY CMakeLists.txt Makefile ./
COPY bench/ bench/
COPY cache/ cache/
COPY config/ config/
COPY kernels/ kernels/
COPY model/ model/
COPY proto/ proto/
COPY scheduler/ scheduler/
COPY server/ server/
COPY tests/ tests/
COPY tools/ tools/
# No CUDA toolkit in this image: the CPU reference backend only.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVD_CUDA=OFF \
 && cmake --build build --target kvd \
 && strip build/server/kvd

# stories260K + tok512, checked against their sha256 (scripts/fetch-model).
RUN KVD_MODEL_CACHE=/opt/kvd/models scripts/fetch-model

# ---- runtime: the binary, its shared libraries, the model -------------------------------
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libyaml-cpp0.7 libabsl20220623 libre2-9 \
      libc-ares2 libssl3 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 kvd \
 && useradd --system --uid 10001 --gid kvd --home-dir /nonexistent --shell /usr/sbin/nologin kvd

COPY --from=build /src/build/server/kvd /usr/local/bin/kvd
COPY --from=build /opt/kvd/models/ /opt/kvd/models/
COPY config/inference_config.yaml /usr/share/doc/kvd/inference_config.yaml

# Where an empty model.path finds stories260K (as scripts/fetch-model does): a config
# mounted with --config replaces the CMD below, --model included, and still serves it.
ENV KVD_MODEL_CACHE=/opt/kvd/models

# Numeric, the kvd user and group made above: Kubernetes' runAsNonRoot can only check a
# numeric USER, so a pod with no runAsUser of its own still starts.
USER 10001:10001
EXPOSE 50051 50052
ENTRYPOINT ["/usr/local/bin/kvd"]
# Every key at its default except these; mount a file and pass --config to change more (the
# defaults listen on 0.0.0.0:50051 and 0.0.0.0:50052, as here).
CMD ["serve", "--model", "/opt/kvd/models/stories260K.bin", \
     "--grpc-address", "0.0.0.0:50051", "--metrics-address", "0.0.0.0:50052"]
