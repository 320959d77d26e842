# Included by ctest after the discovered tests are defined (TEST_INCLUDE_FILES, see
# tests/CMakeLists.txt): tests that change machine-wide state run alone under ctest -j.
# The KernelStackWord hotplug tests take CPU 1 offline for a moment.
set_tests_properties(KernelStackWord.CpuComingOnlineMidSessionIsWatched
                     KernelStackWord.CpuGoingOfflineAndBackIsArmedAgain
                     PROPERTIES RUN_SERIAL TRUE)
