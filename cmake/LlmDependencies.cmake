# Every third-party library of the full build, from Debian 12's packages (`make deps`).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(gflags CONFIG REQUIRED)
# gflags' config names its target with or without a namespace depending on who found it
# first (glog does too); llm::gflags is whichever it chose.
add_library(llm_gflags INTERFACE)
target_link_libraries(llm_gflags INTERFACE ${GFLAGS_LIBRARIES})
add_library(llm::gflags ALIAS llm_gflags)
find_package(glog CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# libyaml (Debian libyaml-dev): the local cluster manifests (deploy/local/*.yaml).
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
# Debian's Gloo ships a CMake config (target `gloo`) under /usr/share/cmake.
find_package(Gloo CONFIG REQUIRED)
add_library(llm_gloo INTERFACE)
target_link_libraries(llm_gloo INTERFACE gloo Threads::Threads)
add_library(llm::gloo ALIAS llm_gloo)

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
