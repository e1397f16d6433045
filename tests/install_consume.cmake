# install_consume.cmake — issue 17: flce as a dependency. Run by CTest:
#   cmake -DBUILD=<build dir> -DSRC=<repository> -DWORK=<scratch dir> -DCC=<c compiler>
#         -DCXX=<c++ compiler> -DGENERATOR=<generator> -P install_consume.cmake
# 1. `cmake --install` the build into a scratch prefix; libflce.so's SONAME is libflce.so.0; the
#    licence is in share/doc/flce;
# 2. examples/ configured with find_package(flce CONFIG) against that prefix, built and run (hello
#    and hello_cpp: their CPU part runs without a GPU);
# 3. examples/hello.c compiled with the README's pkg-config line, read from README.md and run by sh
#    as written (-Wl,-rpath from `pkg-config --variable=libdir flce`), then ./hello run with no
#    LD_LIBRARY_PATH: it validates a problem on the CPU and, without a GPU, says so and exits 0
#    (skipped, said so, where there is no pkg-config);
# 4. a parent project that add_subdirectory()s the repository with its tests off builds hello.c
#    against the target flce (this builds the library once more: the only slow step).
cmake_minimum_required(VERSION 3.25)
foreach(v BUILD SRC WORK CC CXX GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consume.cmake: -D${v}= is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(prefix ${WORK}/prefix)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: status ${rc}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# 1. install
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
file(GLOB libdirs LIST_DIRECTORIES true ${prefix}/lib ${prefix}/lib64)
set(libdir "")
foreach(d IN LISTS libdirs)
  if(EXISTS ${d}/libflce.so)
    set(libdir ${d})
  endif()
endforeach()
foreach(f include/flce.h bin/flce share/doc/flce/LICENSE)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
if(NOT libdir)
  message(FATAL_ERROR "not installed: lib/libflce.so")
endif()
foreach(f libflce.so libflce.so.0 libflce.so.0.1.0 libflce.a pkgconfig/flce.pc
          cmake/flce/flceConfig.cmake cmake/flce/flceConfigVersion.cmake cmake/flce/flceTargets.cmake)
  if(NOT EXISTS ${libdir}/${f})
    message(FATAL_ERROR "not installed: ${libdir}/${f}")
  endif()
endforeach()
file(GLOB exports ${libdir}/cmake/flce/flce*Targets*.cmake)
foreach(f IN LISTS exports)
  file(READ ${f} text)
  if(text MATCHES "/(runtime|generator|templates|testing)[;\"]")
    message(FATAL_ERROR "${f} names an internal include directory")
  endif()
endforeach()
file(GLOB_RECURSE stray RELATIVE ${prefix} ${prefix}/*test_* ${prefix}/*fuzz* ${prefix}/*replay*)
if(stray)
  message(FATAL_ERROR "tests or fuzzers installed: ${stray}")
endif()
file(READ_SYMLINK ${libdir}/libflce.so link)
file(READ_SYMLINK ${libdir}/libflce.so.0 link0)
if(NOT link STREQUAL "libflce.so.0" OR NOT link0 STREQUAL "libflce.so.0.1.0")
  message(FATAL_ERROR "symlinks: libflce.so -> ${link}, libflce.so.0 -> ${link0}")
endif()
find_program(READELF readelf)
if(READELF)
  run("readelf -d" ${READELF} -d ${libdir}/libflce.so.0.1.0)
  if(NOT out MATCHES "\\(SONAME\\)[^\n]*\\[libflce\\.so\\.0\\]")
    message(FATAL_ERROR "SONAME of libflce.so is not libflce.so.0:\n${out}")
  endif()
  # The driver, NVRTC and NCCL are all opened at run time: none is a load-time dependency, so the
  # library loads beside any CUDA major version and where NCCL is absent (issue 17).
  if(out MATCHES "NEEDED[^\n]*(libcuda|libnvrtc|libnccl)" OR out MATCHES "R(UN)?PATH")
    message(FATAL_ERROR "libflce.so records a CUDA library or a search path at load time:\n${out}")
  endif()
else()
  message(STATUS "no readelf: SONAME not checked")
endif()
run("installed flce --version" ${prefix}/bin/flce --version)
message(STATUS "installed: ${out}")

# 2. find_package(flce CONFIG) from examples/
run("configure examples/" ${CMAKE_COMMAND} -S ${SRC}/examples -B ${WORK}/examples -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${CC} -DCMAKE_CXX_COMPILER=${CXX}
  -DCMAKE_BUILD_TYPE=Release)
run("build examples/" ${CMAKE_COMMAND} --build ${WORK}/examples)
foreach(exe hello hello_cpp)
  run("examples/${exe}" ${WORK}/examples/${exe})
  message(STATUS "${exe} (find_package):\n${out}")
  if(NOT out MATCHES "flce 0\\.1\\.0")
    message(FATAL_ERROR "${exe} did not print the version:\n${out}")
  endif()
endforeach()

# 3. pkg-config: the README's line, as written
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  file(STRINGS ${SRC}/README.md readme_lines REGEX "^    cc hello\\.c \\$\\(pkg-config ")
  list(LENGTH readme_lines n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "README.md: expected one line '    cc hello.c $(pkg-config ...' (Install), found ${n}")
  endif()
  string(STRIP "${readme_lines}" line)
  find_program(CC_IN_PATH cc)
  if(NOT CC_IN_PATH) # the README says cc; where there is none, the compiler this build used
    string(REGEX REPLACE "^cc " "${CC} " line "${line}")
  endif()
  file(MAKE_DIRECTORY ${WORK}/pc)
  file(COPY ${SRC}/examples/hello.c DESTINATION ${WORK}/pc)
  set(ENV{PKG_CONFIG_PATH} ${libdir}/pkgconfig)
  execute_process(COMMAND sh -c "${line}" WORKING_DIRECTORY ${WORK}/pc RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/pc/hello)
    message(FATAL_ERROR "the README's line, in ${WORK}/pc: ${line}\nstatus ${rc}\n${out}${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ./hello WORKING_DIRECTORY ${WORK}/pc
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "flce 0\\.1\\.0" OR NOT out MATCHES "problem 4096x2048x32000: valid"
     OR NOT out MATCHES "hidden=1001: FLCE_ERR_INVALID_ARGUMENT: "
     OR NOT out MATCHES "(no GPU, so no workspace size[^\n]*: [^\n]+|workspace for loss and gradients: [0-9.]+ MiB)\n")
    message(FATAL_ERROR "./hello (pkg-config, no LD_LIBRARY_PATH): status ${rc}\n${out}${err}")
  endif()
  message(STATUS "hello (pkg-config, the README's line: ${line}):\n${out}")
else()
  message(STATUS "SKIPPED the pkg-config half: no pkg-config on this machine (apt-get install pkg-config)")
endif()

# 4. add_subdirectory from a parent project, tests off by default there
file(MAKE_DIRECTORY ${WORK}/parent)
file(WRITE ${WORK}/parent/CMakeLists.txt "cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES C)
enable_testing()
add_subdirectory(\"${SRC}\" flce)
foreach(t test_api flce_det_cost replay_problem)
  if(TARGET \${t})
    message(FATAL_ERROR \"subproject flce defined \${t}: tests and benchmarks must be off\")
  endif()
endforeach()
# issue 18: only include/ is public; the internal folders stay with the in-tree flce_internal.
foreach(t flce flce_static)
  get_target_property(dirs \${t} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs MATCHES \"${SRC}/(runtime|generator|templates|testing)\")
    message(FATAL_ERROR \"\${t} gives its users internal include directories: \${dirs}\")
  endif()
endforeach()
add_executable(hello \"${SRC}/examples/hello.c\")
target_link_libraries(hello PRIVATE flce::flce)
")
run("configure the add_subdirectory parent" ${CMAKE_COMMAND} -S ${WORK}/parent -B ${WORK}/parent/build
  -G ${GENERATOR} -DCMAKE_C_COMPILER=${CC} -DCMAKE_BUILD_TYPE=Release)
run("build the add_subdirectory parent" ${CMAKE_COMMAND} --build ${WORK}/parent/build --target hello
  --parallel 2)
run("hello (add_subdirectory)" ${WORK}/parent/build/hello)
message(STATUS "hello (add_subdirectory):\n${out}")
run("ctest -N in the parent" ${CMAKE_CTEST_COMMAND} -N --test-dir ${WORK}/parent/build)
if(NOT out MATCHES "Total Tests: 0")
  message(FATAL_ERROR "the parent project got flce's tests:\n${out}")
endif()
file(REMOVE_RECURSE ${WORK})
message(STATUS "install_and_consume: install, find_package, pkg-config and add_subdirectory all work")
